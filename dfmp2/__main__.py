from dfmp2.entry import main

main()
