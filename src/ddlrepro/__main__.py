from ddlrepro.host.cli import main

main()
