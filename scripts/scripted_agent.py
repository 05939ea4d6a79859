#!/usr/bin/env python3
"""Hand-written proposals, answered to the loop as an agent would.

An engineer's candidates for `cargo kopt optimize --agent cmd:PATH`: PATH is a folder's
`scripted-agent.sh` (examples/*/agents/), which runs `scripted_agent.py answer FOLDER`.
The loop's request arrives on stdin; the answer, on stdout, is `{"text": PROPOSAL}`, where
PROPOSAL is the kernel's `<kernel>.proposal.json` of FOLDER (or of `$KOPT_PROPOSALS`) with
every candidate's source written out.

A proposal file is what the loop reads (kopt_agent::proposal's format), except that a
candidate may point at its source instead of holding it, so that no accepted kernel is
kept twice:

  "source_file": "../kopt/softmax/run-1796024738-r1c1/kernel.cu"
      the file's text (a path relative to the proposal file's folder);
  "source_file": ..., "source_patch": "layer_norm.patch"
      that text with a unified diff (`diff -u BASE NEW`) applied, every hunk's context
      checked.

  scripted_agent.py answer FOLDER          answer the request on stdin
  scripted_agent.py source FILE INDEX      print the source of proposals[INDEX] of FILE
"""

import json
import os
import re
import sys


class ProposalError(Exception):
    pass


def apply_patch(base_text, patch_text, patch_name):
    """`base_text` with the unified diff `patch_text` applied; every context and removed
    line must match the base where its hunk says."""
    base = base_text.splitlines(keepends=True)
    out, at = [], 0
    lines = patch_text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and not lines[i].startswith("@@"):
        i += 1  # the ---/+++ header
    while i < len(lines):
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", lines[i])
        if not m:
            raise ProposalError(f"{patch_name}: line {i + 1} is not a hunk header: {lines[i]!r}")
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        if start < at:
            raise ProposalError(f"{patch_name}: hunks out of order at line {i + 1}")
        out.extend(base[at:start])
        at = start
        i += 1
        while i < len(lines) and not lines[i].startswith("@@"):
            line = lines[i]
            if line.startswith("\\"):  # "\ No newline at end of file"
                if out and out[-1].endswith("\n"):
                    out[-1] = out[-1][:-1]
                i += 1
                continue
            tag, body = line[0], line[1:]
            if tag in " -":
                if at >= len(base) or base[at].rstrip("\n") != body.rstrip("\n"):
                    found = base[at].rstrip("\n") if at < len(base) else "end of file"
                    raise ProposalError(
                        f"{patch_name}: line {at + 1} of the base is {found!r}, the patch expects "
                        f"{body.rstrip(chr(10))!r} (the base changed: make the patch again with diff -u)")
                if tag == " ":
                    out.append(base[at])
                at += 1
            elif tag == "+":
                out.append(body)
            else:
                raise ProposalError(f"{patch_name}: line {i + 1} starts with {tag!r}")
            i += 1
    out.extend(base[at:])
    return "".join(out)


def resolve_candidate(candidate, folder, where):
    """The candidate with its `source` written out from `source_file` (and `source_patch`)."""
    if "source_file" not in candidate:
        if "source_patch" in candidate:
            raise ProposalError(f"{where}: source_patch without the source_file it applies to")
        return candidate
    if "source" in candidate:
        raise ProposalError(f"{where}: both source and source_file (give one)")
    path = os.path.join(folder, candidate["source_file"])
    try:
        text = open(path).read()
    except OSError as e:
        raise ProposalError(f"{where}: source_file {candidate['source_file']}: {e.strerror}")
    out = {k: v for k, v in candidate.items() if k not in ("source_file", "source_patch")}
    if "source_patch" in candidate:
        patch_path = os.path.join(folder, candidate["source_patch"])
        try:
            patch = open(patch_path).read()
        except OSError as e:
            raise ProposalError(f"{where}: source_patch {candidate['source_patch']}: {e.strerror}")
        text = apply_patch(text, patch, candidate["source_patch"])
    out["source"] = text
    return out


def resolved_set(path):
    """The proposal set of file `path`, every candidate's source written out."""
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    try:
        data = json.load(open(path))
    except (OSError, ValueError) as e:
        raise ProposalError(f"{name}: {e}")
    for i, p in enumerate(data.get("proposals", [])):
        if "candidate" in p:
            p["candidate"] = resolve_candidate(p["candidate"], folder, f"{name} proposals[{i}]")
    return data


def kernel_of(request):
    """The kernel a loop's request names (its prompt's "# Kernel `NAME`" heading)."""
    m = re.search(r"# Kernel `([A-Za-z0-9_]+)`", request)
    return m.group(1) if m else None


def main(argv):
    if len(argv) == 3 and argv[1] == "answer":
        folder = os.environ.get("KOPT_PROPOSALS") or argv[2]
        kernel = kernel_of(sys.stdin.read())
        path = os.path.join(folder, f"{kernel}.proposal.json")
        if kernel is None or not os.path.isfile(path):
            print(f"no hand-written proposal for `{kernel}` in {folder}", file=sys.stderr)
            return 3
        print(json.dumps({"text": json.dumps(resolved_set(path), indent=2) + "\n"}))
        return 0
    if len(argv) == 4 and argv[1] == "source":
        sys.stdout.write(resolved_set(argv[2])["proposals"][int(argv[3])]["candidate"]["source"])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except ProposalError as e:
        print(f"scripted agent: {e}", file=sys.stderr)
        sys.exit(4)
