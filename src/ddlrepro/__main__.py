from ddlrepro.host.cli import main
from ddlrepro.shutdown import skip_final_collection

main()
skip_final_collection()
