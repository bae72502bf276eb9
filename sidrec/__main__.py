from sidrec.cli import main

main()
