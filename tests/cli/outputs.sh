#!/bin/bash
# outputs.sh - every output goes through one safe path (issue 17): a symlink
# is written through (the link stays); a FIFO, a device or a folder is
# refused with exit 2 and no hang; an output that is an input (another
# spelling, a hard link) or another output is refused; when one output
# cannot be written none is; SIGINT leaves no temp file; the demo publishes
# its folder only when complete, and makes it (as a temp name) before the
# work; .pt outputs are PyTorch zips.
set -u
. "${EPX_SOURCE:?EPX_SOURCE is not set}/tests/util/cli_test.sh"
cli_scratch outputs
no_temps() { ! ls -a . | grep -q 'epx-tmp'; }

"$EPX" trace synth --model deepseek-v3 --windows 2 --tokens 2000 -o c.json >/dev/null || exit 1
plan=("$EPX" plan --counts c.json --gpus 8)

# JSON-only outputs named .pt are refused before any work (plan --report
# wrote JSON under a .pt name, which torch.load then fails on)
check "plan --report r.pt refused" expect_rc 2 "${plan[@]}" -o p.json --report r.pt
check "  nothing written" test ! -e r.pt
check "bench comm -o s.pt refused" expect_rc 2 "$EPX" bench comm --backend mpi --model mixtral \
    --tokens 1 -o s.pt
check "bench comm --json l.pt refused" expect_rc 2 "$EPX" bench comm --backend mpi \
    --model mixtral --tokens 1 --json l.pt

# symlinks: written through, the link stays a link
check "plan -o p.json" expect_rc 0 "${plan[@]}" -o p.json
ln -s p.json link.json
check "plan -o through a symlink" expect_rc 0 "${plan[@]}" -o link.json --algorithm deepseek
check "the symlink stays" test -L link.json
check "its target was rewritten" grep -q physical_to_logical_map p.json
mkdir sub && ln -s ../p.json sub/rel.json
check "relative symlink in a folder" expect_rc 0 "${plan[@]}" -o sub/rel.json
check "relative symlink stays" test -L sub/rel.json

# non-regular outputs: refused before anything is opened (no hang)
mkfifo fifo
check "-o FIFO refused" expect_rc 2 "${plan[@]}" -o fifo
check "  message names FIFO" grep -q FIFO err
check "--report FIFO refused, no hang" expect_rc 2 "${plan[@]}" -o q.json --report fifo
check "  and -o was not written" test ! -e q.json
check "FIFO still a FIFO" test -p fifo
check "-o /dev/null refused" expect_rc 2 "${plan[@]}" -o /dev/null
check "  message names the device" grep -q "device" err
check "-o folder refused" expect_rc 2 "${plan[@]}" -o sub
check "trace synth -o FIFO" expect_rc 2 "$EPX" trace synth --model deepseek-v3 -o fifo
check "layout -o FIFO" expect_rc 2 "$EPX" layout trivial --layers 2 --experts 8 --gpus 2 -o fifo
mkfifo fifo.json
check "convert OUT FIFO" expect_rc 2 "$EPX" convert c.json fifo.json
ln -s fifo sym.json
check "convert OUT symlink to a FIFO" expect_rc 2 "$EPX" convert c.json sym.json
check "dispatch-table -o FIFO" expect_rc 2 "$EPX" dispatch-table --placement p.json --gpus 8 -o fifo
check "migrate -o FIFO" expect_rc 2 "$EPX" migrate plan --from p.json --to p.json --gpus 8 \
  --expert-bytes 1000 -o fifo

# an output that is an input, or another output
cp c.json keep.json
check "-o = --counts refused" expect_rc 2 "${plan[@]}" -o c.json
check "-o = --counts by another spelling" expect_rc 2 "${plan[@]}" -o ./c.json
ln c.json hard.json
check "-o = a hard link of --counts" expect_rc 2 "${plan[@]}" -o hard.json
check "  the input is untouched" cmp -s c.json keep.json
check "-o = --report refused" expect_rc 2 "${plan[@]}" -o x.json --report ./x.json
check "  nothing written" test ! -e x.json
check "convert IN = OUT refused" expect_rc 2 "$EPX" convert c.json ./c.json
check "dispatch-table -o = --placement" expect_rc 2 "$EPX" dispatch-table --placement p.json \
  --gpus 8 -o ./p.json
check "migrate -o = --to" expect_rc 2 "$EPX" migrate plan --from p.json --to link.json --gpus 8 \
  --expert-bytes 1000 -o p.json

# inputs read as several files: each item of a comma list, each dump in a
# folder, and a --model config are inputs too (each was overwritten once)
mkdir ranks && cp "$EPX_SOURCE/tests/data/pt/per_pass_rank0.pt" ranks/r0.pt
cp ranks/r0.pt r0.pt && cp ranks/r0.pt keep.pt
check "convert LIST OUT = an item refused" refuse "read as part of" "$EPX" convert \
  keep.pt,r0.pt r0.pt
check "  the item is untouched" cmp -s r0.pt keep.pt
check "plan --counts LIST -o an item refused" refuse "same file" "$EPX" plan --counts \
  keep.pt,r0.pt --gpus 8 -o r0.pt
check "plan --counts DIR -o a dump in it refused" refuse "read as part of 'ranks'" "$EPX" plan \
  --counts ranks --gpus 8 -o ranks/r0.pt
check "  the dump is untouched" cmp -s ranks/r0.pt keep.pt
printf '{"model_type": "mixtral", "num_hidden_layers": 2, "num_local_experts": 8, ' >cfg.json
printf '"num_experts_per_tok": 2, "hidden_size": 64, "intermediate_size": 128}' >>cfg.json
cp cfg.json keep-cfg.json
check "trace synth --model CFG -o CFG refused" refuse "is the input" "$EPX" trace synth \
  --model cfg.json -o cfg.json
check "  the config is untouched" cmp -s cfg.json keep-cfg.json
mkdir dd && cp cfg.json dd/placement.json
check "demo --model inside --out refused" refuse "which the demo replaces" "$EPX" demo \
  --model dd/placement.json --gpus 2 --redundant 0 --windows 2 --tokens 100 --out dd
check "  the config is untouched" cmp -s dd/placement.json keep-cfg.json
check "demo --out '' refused" refuse "--out is empty" "$EPX" demo --out ''
# '-' is standard output only where the output is appended JSON lines
check "plan -o - refused" refuse "names no file" "${plan[@]}" -o -
check "  no file named -" test ! -e ./-

# if one output cannot be written, none is
check "--report in a missing folder" expect_rc 2 "${plan[@]}" -o y.json --report nodir/r.json
check "  -o not written" test ! -e y.json
if [ "$(id -u)" != 0 ]; then
  mkdir ro && chmod 555 ro
  check "--report in a read-only folder" expect_rc 2 "${plan[@]}" -o z.json --report ro/r.json
  check "  -o not written" test ! -e z.json
fi
# a folder that takes no file is found before the work, by making the temp
# file there and removing it: /proc takes none, though access() says it is
# writable to root (the command once failed only after its work)
if [ -d /proc/self ]; then
  check "-o in /proc refused before the work" refuse \
    "cannot write '/proc/epx-p.json': no file can be made in folder '/proc'" \
    "${plan[@]}" -o y.json --report /proc/epx-p.json
  check "  -o not written" test ! -e y.json
fi
# standard output is no output here (outputs are files, written via a temp
# file): said so, to a pipe, to a redirect (whose file was replaced) and
# through a link; it said "no file can be made in folder '/proc/self/fd'"
check "-o /dev/stdout to a pipe refused" sh -c '"$@" 2>err | cat >/dev/null; grep -qF "output '"'"'/dev/stdout'"'"' is a stream (standard output or an open file), not a file" err' - "${plan[@]}" -o /dev/stdout
echo keep >redir.txt
check "-o /dev/stdout to a redirect refused" sh -c '"$@" >>redir.txt 2>err; [ $? -eq 2 ] && grep -qF "is a stream" err' - "${plan[@]}" -o /dev/stdout
check "  the redirect's file kept" test "$(cat redir.txt)" = keep
ln -s /dev/stdout out-link.json
check "-o a link to /dev/stdout refused" sh -c '"$@" 2>err | cat >/dev/null; grep -qF "a stream (standard output or an open file), not a file" err' - "${plan[@]}" -o out-link.json
check "--report /dev/fd/1 refused" refuse "is a stream" "${plan[@]}" -o q.json --report /dev/fd/1
check "  -o not written" test ! -e q.json
check "no temp files left" no_temps

# .pt by extension: a PyTorch zip, read back by content
check "plan -o p.pt" expect_rc 0 "${plan[@]}" -o p.pt
check "  is a zip" sh -c 'head -c 2 p.pt | grep -q PK'

# SIGINT while writing: the temp file goes, the target never appears
"$EPX" trace synth --model kimi-k2 --windows 1000 -o big.json >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 400); do ls -a | grep -q 'big.json.epx-tmp' && break; sleep 0.05; done
if ls -a | grep -q 'big.json.epx-tmp'; then
  kill -INT $pid; wait $pid
  check "SIGINT removes the temp file" no_temps
  check "SIGINT leaves no target" test ! -e big.json
else
  wait $pid
  echo "note: the write ended before it could be interrupted"
fi

# bench comm: -o replaced, --json appended; both checked before the run
bench=("$EPX" bench comm --backend mpi --model mixtral-8x7b --tokens 1)
if timeout 60 "${bench[@]}" --json j.jsonl -o s.json >/dev/null 2>&1; then
  check "bench --json FIFO refused" expect_rc 2 "${bench[@]}" --json fifo
  check "bench --json = -o refused" expect_rc 2 "${bench[@]}" --json j.jsonl -o ./j.jsonl
  check "bench -o /dev/null refused" expect_rc 2 "${bench[@]}" -o /dev/null
  check "bench --json appends" expect_rc 0 "${bench[@]}" --json j.jsonl
  check "  two runs, more lines than one" test "$(wc -l < j.jsonl)" -ge 2
else
  echo "note: bench comm --backend mpi cannot run here; its output checks skipped"
fi

# the demo: a folder appears only complete; an old demo folder is replaced
check "demo" expect_rc 0 "$EPX" demo --out demo1
check "demo again over it" expect_rc 0 "$EPX" demo --out demo1/
check "  five files" test "$(ls demo1 | wc -l)" = 5
touch demo1/mine
check "demo over a foreign folder refused" expect_rc 2 "$EPX" demo --out demo1
check "  the foreign file stays" test -e demo1/mine
check "demo over a file refused" expect_rc 2 "$EPX" demo --out c.json
# An --out that cannot be made fails before the work (a minute of planning
# at 256 GPUs; it once failed only after it): /proc takes no folder, though
# access() says it is writable to root.
slow=(--gpus 256 --redundant 256)
if [ -d /proc/self ]; then
  check "demo --out /proc/x refused before the work" refuse \
    "cannot create --out '/proc/epx-demo': no folder can be made in '/proc/'" \
    "$EPX" demo "${slow[@]}" --out /proc/epx-demo
fi
# The demo makes its temp folder beside an existing --out before the work
# and never touches the old folder until done: interrupted, it leaves no
# half folder and the old one as it was. (SIGINT goes once the temp folder
# is there: sent at once, it could reach the forked shell before epx, which
# ran this script's EXIT trap and removed the scratch folder.)
rm demo1/mine
cp -r demo1 demo1-before
"$EPX" demo "${slow[@]}" --out demo1 >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 100); do ls -a | grep -q 'demo1.epx-tmp' && break; sleep 0.05; done
check "demo makes its temp folder before the work" sh -c 'ls -a | grep -q "demo1.epx-tmp"'
kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null
check "  interrupted, it leaves no half folder" sh -c '! ls -a | grep -q "demo1.epx-tmp"'
check "  and the old folder is untouched" diff -r demo1 demo1-before
check "no temp files at the end" no_temps

exit $fail
