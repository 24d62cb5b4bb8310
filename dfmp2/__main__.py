from dfmp2.cli import main

main(prog_name="dfmp2")
