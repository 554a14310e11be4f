#!/usr/bin/env bash
# The shape of the tree (STYLE.md, "Shape of the tree"), as the Makefile
# enforces it: each room compiles with its own include paths (INC_* in the
# Makefile, read here with `make print-INC_<room>`), so a daemon that
# includes another daemon's header does not compile, a library of
# common/<lib>/ sees no daemon and no generated protobuf code, and the CLI
# (tools/) reaches no daemon's header.  Only the preprocessor runs (-E):
# whether a header is FOUND is the question.  Each refusal is paired with
# the control that the same flags do find the room's own headers, so a
# failure cannot come from broken flags.
#
# 5-8. The README as a manual: its layout block (the fenced block under
# "## Layout") names every source file of the tree and nothing that is not
# there; README.md stays at most 600 lines; README.md and docs/*.md speak
# of the project as it is ("this session", "the issue" are diary words);
# the README's two commands are the ones .ci/run runs.
# 9. One of each small thing: clock_gettime only in common/clock.h, files
# replaced only through common/fsio.c, the embedding methods called only
# through embc, and no file of common/ services/ tools/ over 900 lines.
# The scope of "every source file": *.c *.h *.cc *.cu *.proto *.sh *.py
# under common/ services/ tools/ proto/ tests/, and every file of deploy/
# and systemd/; not tests/fuzz/corpus/ (seed data), and not the tests
# themselves -- tests/unit/test_*.c, tests/integration/test_*.sh,
# tests/fuzz/fuzz_*.c --, which the block names by their pattern.
source "$(dirname "$0")/lib.sh"

CC=${CC:-cc}
SERVICES=$(cd "$ROOT/services" && ls -d -- */ | tr -d /)
ROOMS=$(printf '%s\n' $SERVICES trainer oracle model plan store cli | sort -u)   # each goal once
# the base flags, then each room's include paths, one line each (one make)
mapfile -t LINES < <(make --no-print-directory -s -C "$ROOT" BUILD="$BUILD" print-CPPFLAGS \
                       $(for r in $ROOMS; do echo "print-INC_$r"; done))
BASE=${LINES[0]:-}
declare -A INC=()
i=1
for r in $ROOMS; do INC[$r]=${LINES[$i]:-}; i=$((i + 1)); done
[ -n "$BASE" ] && [ -n "${INC[trainer]}" ] && [ -n "${INC[cli]}" ]
expect "make print-CPPFLAGS print-INC_<room> give the flags (trainer: ${INC[trainer]})"

# finds ROOM HEADER: 0 if a file that includes HEADER preprocesses with
# ROOM's flags (from the repository root, as make compiles); the
# compiler's message in $WORK/pp.err
finds() {
  [ -n "${INC[$1]:-}" ] || { echo "# make print-INC_$1 is empty" >"$WORK/pp.err"; return 2; }
  # shellcheck disable=SC2086 # the flags are a list
  (cd "$ROOT" && printf '#include "%s"\n' "$2" | "$CC" $BASE ${INC[$1]} -E -o /dev/null -x c - 2>"$WORK/pp.err")
}

# 1. The case in point: the trainer's flags do not reach the oracle's job.
if finds trainer oracle_job.h; then rc=1; else rc=0; fi
grep -q 'oracle_job.h' "$WORK/pp.err" || rc=1
expect_rc $rc "#include \"oracle_job.h\" with the trainer's flags fails: $(head -1 "$WORK/pp.err")"
finds oracle oracle_job.h
expect "control: the oracle's flags find oracle_job.h"
finds trainer nn.h && finds trainer trainer_step.h
expect "control: the trainer's flags find nn.h (common/model) and trainer_step.h"

# 2. Every daemon: its own headers are found, no other daemon's is.
for s in $SERVICES; do
  own_bad="" other_found=""
  for h in "$ROOT/services/$s"/*.h; do
    [ -e "$h" ] || continue
    finds "$s" "$(basename "$h")" || own_bad="$own_bad $(basename "$h")"
  done
  for t in $SERVICES; do
    [ "$t" = "$s" ] && continue
    for h in "$ROOT/services/$t"/*.h; do
      [ -e "$h" ] || continue
      finds "$s" "$(basename "$h")" && other_found="$other_found $t/$(basename "$h")"
    done
  done
  [ -z "$own_bad" ]
  expect_rc $? "chanter-$s's flags find its own headers (not found:${own_bad:- none})"
  [ -z "$other_found" ]
  expect_rc $? "chanter-$s's flags find no other daemon's header (found:${other_found:- none})"
done

# 3. The libraries and the CLI: no daemon header; the libraries not the
# generated protobuf code either (the math never sees protobuf).
for room in model plan store cli; do
  found=""
  for h in "$ROOT"/services/*/*.h; do
    [ -e "$h" ] || continue
    finds "$room" "$(basename "$h")" && found="$found ${h#"$ROOT"/services/}"
  done
  [ -z "$found" ]
  expect_rc $? "the $room room's flags find no daemon header (found:${found:- none})"
done
for lib in model plan store; do
  finds "$lib" cfg.h
  expect "control: common/$lib's flags find common/cfg.h"
  if finds "$lib" embedding.pb-c.h; then rc=1; else rc=0; fi
  expect_rc $rc "common/$lib's flags do not find the generated embedding.pb-c.h"
done
finds cli embedding.pb-c.h && finds cli nn.h && finds cli plan.h && finds cli store.h
expect "control: the CLI's flags find the generated code and the libraries' headers"

# 4. The sources say the same: no file in tools/ or common/ includes a
# header of services/ (by path or by a name that only services/ has).
svc_names=" $(cd "$ROOT/services" && ls -- */*.h | xargs -n1 basename | tr '\n' ' ') "
for dir in tools common; do
  bad=""
  while IFS= read -r line; do
    f=${line%%:*} name=${line#*\"}; name=${name%%\"*}
    case "$name" in *services/*) bad="$bad $f:$name"; continue;; esac
    own=$ROOT/$(dirname "$f")/$name   # its own directory first, as the compiler looks
    if [ -e "$own" ]; then
      case "$(realpath -m "$own")" in "$ROOT"/services/*) bad="$bad $f:$name";; esac
      continue
    fi
    case "$svc_names" in *" $(basename "$name") "*) bad="$bad $f:$name";; esac
  done < <(cd "$ROOT" && grep -rHE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$dir" \
             --include='*.c' --include='*.h' --include='*.cu' --include='*.cc')
  [ -z "$bad" ]
  expect_rc $? "no file in $dir/ includes a services/ header (offenders:${bad:- none})"
done

# 5. The README's layout block names every source file, and only files
# that exist.  A line starting at column 0 with DIR/ sets the directory of
# the names on it and on the indented lines below; a name is a word ending
# in one of the extensions above (or .ini .service .target .md .json .yml), x.[ch]
# standing for x.c and x.h.
LAYOUT_OUT=$WORK/layout-check.txt
python3 - "$ROOT" >"$LAYOUT_OUT" <<'PY'
import os, re, sys
root = sys.argv[1]
text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
m = re.search(r"^## Layout\n.*?^```\n(.*?)^```", text, re.S | re.M)
if not m:
    print("README.md has no fenced block under '## Layout'")
    sys.exit(0)
named = set()
cur = ""
name_re = re.compile(r"(?<![\w@.<>+-])([\w@+-][\w@.+-]*\.(?:\[ch\]|cc|cu|c|h|proto|sh|py|ini|service|target|md|json|yml|txt|dataset))(?![\w.>-])")
for line in m.group(1).splitlines():
    if line[:1] not in ("", " "):
        first = line.split()[0]
        cur = first if first.endswith("/") else ""
    for n in name_re.findall(line):
        if n.endswith(".[ch]"):
            named.update({cur + n[:-5] + ".c", cur + n[:-5] + ".h"})
        else:
            named.add(cur + n)
exts = (".c", ".h", ".cc", ".cu", ".proto", ".sh", ".py")
tree = set()
for top in ("common", "services", "tools", "proto", "tests", "deploy", "systemd"):
    for d, dirs, files in os.walk(os.path.join(root, top)):
        rel = os.path.relpath(d, root)
        if rel.startswith("tests/fuzz/corpus"):
            dirs[:] = []
            continue
        for f in files:
            path = os.path.join(rel, f)
            if top not in ("deploy", "systemd") and not f.endswith(exts):
                continue
            if (rel == "tests/unit" and f.startswith("test_") and f.endswith(".c")) or \
               (rel == "tests/integration" and f.startswith("test_") and f.endswith(".sh")) or \
               (rel == "tests/fuzz" and f.startswith("fuzz_") and f.endswith(".c")):
                continue
            tree.add(path)
missing = sorted(tree - named)
ghosts = sorted(n for n in named if not os.path.exists(os.path.join(root, n)))
for f in missing:
    print("missing from the layout block: " + f)
for f in ghosts:
    print("named in the layout block but not in the tree: " + f)
print("# %d source files in scope, %d names in the block" % (len(tree), len(named)), file=sys.stderr)
PY
py_rc=$?
missing=$(sed -n 's/^missing from the layout block: //p' "$LAYOUT_OUT" | tr '\n' ' ')
absent=$(sed -n 's/^named in the layout block but not in the tree: //p' "$LAYOUT_OUT" | tr '\n' ' ')
[ "$py_rc" -eq 0 ] && [ ! -s "$LAYOUT_OUT" ]
expect_rc $? "README's layout block names every source file of the tree (missing: ${missing:-none}) and no file that is not there (absent: ${absent:-none})"
if [ -s "$LAYOUT_OUT" ]; then sed "s/^/#   /" "$LAYOUT_OUT"; fi

# 6. The README is a manual, not a reference: at most 600 lines.
readme_lines=$(wc -l <"$ROOT/README.md")
[ "$readme_lines" -le 600 ]
expect_rc $? "README.md has $readme_lines lines (at most 600; details go to docs/)"

# 7. The README and docs/ say what is, not how it came to be.
diary=$(cd "$ROOT" && grep -n -i -E 'this session|the issue' README.md docs/*.md)
[ -z "$diary" ]
expect_rc $? "README.md and docs/*.md have no 'this session' / 'the issue' phrasing${diary:+: $(echo "$diary" | head -5 | tr '\n' ' ')}"

# 8. The README's two commands are the ones CI runs, in the same order:
# the sh block under "## Two commands" against .ci/run's `make` lines.
readme_cmds=$(awk '/^## Two commands/{f=1} f&&/^```sh/{b=1;next} b&&/^```/{exit} b{sub(/[[:space:]]*#.*/,""); if($0!="")print}' "$ROOT/README.md")
ci_cmds=$(grep -E '^make( |$)' "$ROOT/.ci/run")
[ -n "$readme_cmds" ] && [ "$readme_cmds" = "$ci_cmds" ]
expect_rc $? "README's two commands are .ci/run's (README: ${readme_cmds//$'\n'/; }; .ci/run: ${ci_cmds//$'\n'/; })"

# 9. One of each small thing (the restructure's rules, kept by this test):
# the clock only in common/clock.h (gRPC's own gpr_ deadlines aside), a
# file replaced only through common/fsio.c (the store's two directory
# renames aside), the embedding service's methods named only in embc, and
# no file of common/ services/ tools/ over 900 lines.
SRC=$(cd "$ROOT" && find common services tools \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' \) | sort)
clocks=$(cd "$ROOT" && grep -l 'clock_gettime' $SRC | grep -v '^common/clock\.h$' | tr '\n' ' ')
[ -z "$clocks" ]
expect_rc $? "clock_gettime only in common/clock.h (others: ${clocks:-none})"
renames=$(cd "$ROOT" && grep -l '\brename(' $SRC | grep -v -x -e common/fsio.c -e common/store/store_dir.c -e common/store/store_ckpt.c | tr '\n' ' ')
[ -z "$renames" ]
expect_rc $? "files are replaced through fsio_replace (rename( elsewhere: ${renames:-none})"
wire=$(cd "$ROOT" && grep -l 'embc_call\|chanter__embedding__v1__embedding__descriptor' $SRC | grep -v -x -e common/embc.c -e services/embedding/embedding_service.c | tr '\n' ' ')
[ -z "$wire" ]
expect_rc $? "the embedding service's methods are called only through embc's typed calls (elsewhere: ${wire:-none})"
long=$(cd "$ROOT" && wc -l $SRC | awk '$2 != "total" && $1 > 900 {printf "%s (%d) ", $2, $1}')
[ -z "$long" ]
expect_rc $? "no file of common/ services/ tools/ is over 900 lines (over: ${long:-none})"

finish
