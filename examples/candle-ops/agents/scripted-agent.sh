#!/bin/sh
# A scripted agent for `cargo kopt optimize --agent cmd:PATH`: an engineer in the loop whose
# candidates are hand-written. It answers a request for kernel K with `K.proposal.json`
# next to this script (or in `$KOPT_PROPOSALS`), each candidate's source written out from
# the file it points at (scripts/scripted_agent.py says how).
exec python3 "$(dirname "$0")/../../../scripts/scripted_agent.py" answer "$(dirname "$0")"
