"""Seismic's accuracy/speed knobs, named and range-checked: one for building an index, one for searching it.

Build knobs shape the index (Bruch et al., SIGIR 2024, §4): each term's inverted list keeps its highest impacts
(`n_postings` on average over the vocabulary, at most `max_fraction` × that for one term), is cut into blocks by
clustering its documents (`centroid_fraction` × the list's length blocks, none smaller than `min_cluster_size`,
assigned from each document's `doc_cut` highest terms), and each block gets a summary vector that keeps
`summary_energy` of its L1 mass. Search knobs decide how much of it a query reads: the lists of its `query_cut`
highest-weighted terms, and in them only the blocks whose summary score reaches `heap_factor` × the k-th best score
found so far (0: every block, which with unpruned lists is exact).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from lsr_index.errors import LsrIndexError

# name: (type, lowest, highest, what the range means); the lowest bound of a float is excluded where noted
RANGES: dict[str, tuple[type, float, float, str]] = {
    "n_postings": (int, 1, 100_000_000, "an integer in 1..100,000,000"),
    "centroid_fraction": (float, 0.0, 1.0, "a number in (0, 1]"),
    "summary_energy": (float, 0.0, 1.0, "a number in (0, 1]"),
    "max_fraction": (float, 1.0, 1000.0, "a number in [1, 1000]"),
    "min_cluster_size": (int, 1, 1_000_000, "an integer in 1..1,000,000"),
    "doc_cut": (int, 1, 100_000, "an integer in 1..100,000"),
    "threads": (int, 1, 4096, "an integer in 1..4096, or unset for every core"),
    "query_cut": (int, 1, 100_000, "an integer in 1..100,000"),
    "heap_factor": (float, 0.0, 1.0, "a number in [0, 1]"),
}
OPEN_LOW = {"centroid_fraction", "summary_energy"}
# what each knob does, for the command line's --help
HELP = {
    "n_postings": "Postings each term's inverted list keeps on average (its highest impacts): more is more "
                  "accurate, larger and slower to build. Raise it for a million documents or more (measured: 3000 "
                  "with --centroid-fraction 0.05 at 1M; docs/engines.md).",
    "centroid_fraction": "Blocks a list is clustered into, as a fraction of its postings.",
    "summary_energy": "Share of a block's L1 mass its summary vector keeps: more skips blocks more surely.",
    "max_fraction": "One term's list holds at most this many times n_postings postings.",
    "min_cluster_size": "Smaller blocks are merged into others.",
    "doc_cut": "Highest terms of a document used to assign it to a block.",
    "query_cut": "Lists a query reads: those of its highest-weighted terms. More is more accurate and slower.",
    "heap_factor": "A block is read when its summary's score reaches this share of the k-th best score found so "
                   "far: lower is more accurate and slower (0: every block).",
}


def _check(owner: str, name: str, value: object) -> None:
    kind, low, high, text = RANGES[name]
    if name == "threads" and value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = number and (kind is float or isinstance(value, int)) and low <= value <= high \
        and not (name in OPEN_LOW and value == low) and value == value  # NaN fails the last test
    if not ok:
        raise LsrIndexError(f"seismic {owner} option {name} must be {text}, got {value!r}")


class _Options:
    """Shared by both: checks on creation, a plain dict for records, and reading one back."""

    def __post_init__(self) -> None:
        owner = "build" if isinstance(self, SeismicBuild) else "search"
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "first_sorted":
                if not isinstance(value, bool):
                    raise LsrIndexError(f"seismic search option first_sorted must be true or false, got {value!r}")
                continue
            _check(owner, f.name, value)
            if RANGES[f.name][0] is float and isinstance(value, int):
                object.__setattr__(self, f.name, float(value))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, body: object, origin: str = "seismic options"):
        """From a record or a caller's settings: unknown names and bad values are refused, in one line."""
        names = [f.name for f in fields(cls)]
        if not isinstance(body, dict):
            raise LsrIndexError(f"{origin}: expected an object with some of {', '.join(names)}")
        unknown = sorted(set(body) - set(names))
        if unknown:
            raise LsrIndexError(f"{origin}: unknown seismic option {unknown[0]!r} (known: {', '.join(names)})")
        return cls(**body)


@dataclass(frozen=True)
class SeismicBuild(_Options):
    """How the index is built; defaults measured in benchmarks/bench_search.py (see its results)."""

    n_postings: int = 1000  # postings kept per term on average (the highest impacts of the whole collection)
    centroid_fraction: float = 0.1  # blocks per list, as a fraction of its length
    summary_energy: float = 0.4  # share of a block's L1 mass its summary keeps
    max_fraction: float = 1.5  # one term's list holds at most max_fraction × n_postings postings
    min_cluster_size: int = 2  # smaller blocks are merged into others
    doc_cut: int = 15  # terms of a document used to assign it to a block
    threads: int | None = None  # build threads (Seismic's Rayon pool); None: every core this process may use


@dataclass(frozen=True)
class SeismicSearch(_Options):
    """How much of the index a query reads. The defaults, measured in benchmarks/bench_search.py: recall@10 against
    the exact run of 0.985 on SciFact and 0.997 on 200,000 synthetic documents (query_cut 5 gave 0.938 and 0.968);
    nDCG@10 on SciFact 0.0016 above the exact run's. Measured figures: docs/engines.md."""

    query_cut: int = 10  # lists read: those of the query's highest-weighted terms
    heap_factor: float = 0.9  # a block is read when its summary score ≥ heap_factor × the k-th best score so far
    first_sorted: bool = True  # read the first list's blocks best summary first (faster at equal accuracy)
