from ddlrepro.cli import main

main()
