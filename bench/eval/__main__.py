from bench.eval.cli import main

main()
