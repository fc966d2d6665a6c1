# The workflow imports the installed ddlrepro (`make env` installs this checkout's src/ editable) and never edits
# sys.path, PATH or PYTHONPATH: the environment it is started in is the one its jobs run in (Slurm jobs inherit
# it too: sbatch exports it). Without the package, or when the jobs' `python` would run another copy, it stops here.
#
# Config files are parsed here before Snakemake's `configfile:` reads them, so a YAML error or an empty file is
# refused naming the file, line and column (Snakemake's own message names neither). Files given with
# --configfile are read by Snakemake's command line before any workflow code: `python -m ddlrepro validate FILE`.
from snakemake.exceptions import WorkflowError

ACTIVATE = (
    "activate the project's environment first (`source .venv/bin/activate`; `make env` creates it)"
    " or run the workflow through `make reproduce`"
)
try:
    from ddlrepro.host.config import ConfigError, load_config_file
    from ddlrepro.host.jobenv import jobs_package_problem
except ImportError as error:
    raise WorkflowError(
        f"the workflow cannot import ddlrepro ({error}): {ACTIVATE}"
    ) from None

if problem := jobs_package_problem():
    raise WorkflowError(f"{problem}: {ACTIVATE}")

try:
    for config_path in [
        Path(workflow.basedir) / "config" / "config.yaml",
        *map(Path, workflow.overwrite_configfiles),
    ]:
        load_config_file(config_path)
except ConfigError as error:
    raise WorkflowError(str(error)) from None
