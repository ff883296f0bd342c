"""Ready pipeline configs (YAML files), installed as ``dataloader.configs``."""

if __name__ != "dataloader.configs":  # pragma: no cover - a wrong sys.path, not a user error
    raise ImportError(
        f"this folder is installed as dataloader.configs, but it was imported as {__name__!r}; "
        f"import dataloader.configs (install the project with pip install -e . to develop it)"
    )
