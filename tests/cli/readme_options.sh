# readme_options.sh - README.md's CLI reference table names every option each
# subcommand's --help lists (and no option --help does not list), so the table
# cannot fall behind the parser: --help is generated from the option tables
# the parser reads (tools/epx/cli.h).
. "$(dirname "$0")/../util/cli_lib.sh"
readme="$EPX_SOURCE/README.md"
[ -f "$readme" ] || fail "README.md not found at $readme"

bad=0
for cmd in demo plan eval inspect "layout trivial" stats convert "trace synth" dispatch-table \
    "migrate plan" "bench comm" advise; do
    # shellcheck disable=SC2086 # the two-word commands are two arguments
    expect_exit 0 "$EPX" $cmd --help
    mv "$TMP/out" "$TMP/help"
    python3 - "$readme" "$cmd" "$TMP/help" <<'PY' || bad=1
import re, sys
readme, cmd, help_path = sys.argv[1:]
rows = [line for line in open(readme)
        if line.startswith("| `epx ") and re.match(r"\| `epx [^`]*", line)]
# the rows of this command: those whose first cell starts `epx CMD ` (a row
# naming several commands, `epx plan` / `epx stats` / ..., counts for each)
cells = [re.split(r"(?<!\\)\|", line)[1] for line in rows]  # `\|` is a pipe inside a cell
mine = [c for c in cells if re.search(r"`epx %s[ `]" % re.escape(cmd), c)]
if not mine:
    sys.exit("FAIL: README's CLI table has no row for 'epx %s'" % cmd)
table = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-o)\b", " ".join(mine)))
helped = set()
for line in open(help_path):
    m = re.match(r"  (--[a-z][a-z0-9-]*|-o)\b", line)
    if m:
        helped.add(m.group(1))
helped -= {"--help"}
missing, stale = sorted(helped - table), sorted(table - helped)
if missing or stale:
    sys.exit("FAIL: README's CLI table for 'epx %s': missing %s; not in --help %s"
             % (cmd, missing or "none", stale or "none"))
PY
done
[ "$bad" = 0 ] || fail "README.md's CLI reference table and --help differ (above)"
echo "readme_options: the CLI table names every option of 12 subcommands"
