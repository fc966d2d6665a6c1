# Config files are parsed here before Snakemake's `configfile:` reads them, so a YAML error or an empty file is
# refused naming the file, line and column (Snakemake's own message names neither). Files given with
# --configfile are read by Snakemake's command line before any workflow code: `python -m ddlrepro validate FILE`.
import sys

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from ddlrepro.host.config import ConfigError, load_config_file

try:
    for config_path in [
        Path(workflow.basedir) / "config" / "config.yaml",
        *map(Path, workflow.overwrite_configfiles),
    ]:
        load_config_file(config_path)
except ConfigError as error:
    raise WorkflowError(str(error)) from None
