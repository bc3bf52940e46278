"""`python -m lsr_index`: the command line, as the `lsr-index` script runs it."""

from lsr_index.cli import main

main(prog_name="lsr-index")
