#!/usr/bin/env bash
# stage_deepep.sh - copy the few DeepEP files that tools/deepep_ll_check.py
# runs (its low-latency test and the deep_ep/utils helpers the test imports)
# out of a DeepEP git directory into .deepep/ at the repository root.
#
# Copyright the epx authors. Licensed under the Apache License, Version 2.0;
# you may use this file only in compliance with that license, a copy of which
# is at http://www.apache.org/licenses/LICENSE-2.0. It is distributed "AS IS",
# without warranties or conditions of any kind.
#
# DeepEP's files are never committed here: .deepep/ is listed in
# .git/info/exclude, and the device tool carries it (carry: [".deepep"]).
#
#   tools/stage_deepep.sh GIT_DIR [REV]   (GIT_DIR: a clone's .git or a bare
#                                          repository; REV defaults to HEAD)
set -eu
git_dir=${1:?usage: tools/stage_deepep.sh DEEPEP_GIT_DIR [REV]}
rev=${2:-HEAD}
cd "$(dirname "$0")/.."
g() { git --git-dir="$git_dir" "$@"; }
commit=$(g rev-parse --verify "$rev^{commit}")

# The test, DeepEP's license, and every Python file of deep_ep/utils/.
files="tests/legacy/test_low_latency.py tests/legacy/test_intranode.py LICENSE $(g ls-tree --name-only "$commit" deep_ep/utils/ |
    grep '\.py$' | tr '\n' ' ')"
g cat-file -e "$commit:tests/legacy/test_low_latency.py" || {
    echo "stage_deepep.sh: $commit has no tests/legacy/test_low_latency.py" >&2
    exit 1
}

grep -qx '/.deepep/' .git/info/exclude 2>/dev/null || echo '/.deepep/' >>.git/info/exclude
rm -rf .deepep
for f in $files; do
    mkdir -p ".deepep/$(dirname "$f")"
    g show "$commit:$f" >".deepep/$f"
done
echo "$commit" >.deepep/COMMIT
echo "staged DeepEP $commit into .deepep/:"
(cd .deepep && find . -type f | sort | sed 's|^\./|  |')
du -sh .deepep
