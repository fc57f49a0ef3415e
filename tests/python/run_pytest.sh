#!/usr/bin/env bash
# run_pytest.sh PYTHON FILE: runs one test file under pytest; exit 77 (CTest's
# skip) when pytest is missing or collected nothing, else pytest's status.
set -u
py=$1
shift
if ! "$py" -c "import pytest" 2>/dev/null; then
	echo "run_pytest.sh: $py has no pytest (scripts/setup.sh makes .venv with pytest): skipped"
	exit 77
fi
"$py" -m pytest -q -rs -p no:cacheprovider "$@"
st=$?
if [ "$st" = 5 ]; then
	echo "run_pytest.sh: no tests collected: skipped"
	exit 77
fi
exit "$st"
