"""Files that `mypy --strict` checks (as part of `make test`) and pytest never runs."""
