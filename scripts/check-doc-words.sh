#!/usr/bin/env bash
# check-doc-words.sh [DIR]: the user documentation speaks of the product, not of how it was built.
#
# Fails (exit 1, one FILE:LINE: TEXT per hit) when a phrase below appears in README.md or in any
# Markdown file under docs/ of DIR (default: the repository). The phrases name the work around
# the product (work sessions, GPU time budgets, borrowed machines, numbered runs); how the work
# went belongs in git history and CHANGELOG.md. "session" alone is a product word (a guest
# process's session), so only phrases that cannot mean that are listed. Case-insensitive,
# extended regular expressions.
set -uo pipefail
dir=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
patterns=(
    'this session'
    '\b(third|fourth|fifth) session'
    'device[- ]time'
    'device[- ]minutes'
    '\blent\b'
    '\bthe lead\b'
    '\bcalls? [0-9]+\b'
    'still to make'
    'work session'
)
files=()
[[ -f $dir/README.md ]] && files+=("$dir/README.md")
if [[ -d $dir/docs ]]; then
    while IFS= read -r -d '' f; do files+=("$f"); done < <(find "$dir/docs" -name '*.md' -print0 | sort -z)
fi
if ((${#files[@]} == 0)); then
    echo "check-doc-words: no README.md or docs/ under $dir" >&2
    exit 2
fi
hits=0
for p in "${patterns[@]}"; do
    while IFS= read -r line; do
        echo "${line#"$dir"/}  [phrase: $p]"
        hits=$((hits + 1))
    done < <(grep -n -i -E -H -- "$p" "${files[@]}")
done
if ((hits > 0)); then
    echo "check-doc-words: $hits line(s) speak of the work, not the product (see the header of $0)" >&2
    exit 1
fi
echo "check-doc-words: ${#files[@]} files, none of ${#patterns[@]} phrases"
