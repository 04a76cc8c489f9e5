# The two commands of the README. Both create the environment on first use (scripts/bootstrap.sh).
.PHONY: lab test lint format clean-env

lab:  ## start JupyterLab on notebooks/ (127.0.0.1, token printed)
	scripts/lab.sh

test:  ## the whole test suite (what CI runs)
	scripts/test.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

format:
	.venv/bin/ruff format . && .venv/bin/ruff check --fix .

clean-env:
	rm -rf .venv
