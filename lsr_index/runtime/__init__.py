"""What every stage runs on: durable files and locks, child processes, threads, progress on the terminal."""
