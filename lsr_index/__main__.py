from lsr_index.cli import main

main()
