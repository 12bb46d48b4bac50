"""Print the README command marked `<!-- command: NAME -->`, so CI runs exactly what a user pastes.

Usage: python3 .ci/readme_command.py serve|test   (the marker is followed by a ```bash block; its
non-comment lines are joined with newlines).
"""

import pathlib
import re
import sys

readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
name = sys.argv[1]
match = re.search(rf"<!-- command: {re.escape(name)} -->\s*```bash\n(.*?)```", readme, re.S)
if match is None:
    sys.exit(f"README.md has no command marked <!-- command: {name} -->")
print("\n".join(line for line in match[1].splitlines() if line.strip() and not line.lstrip().startswith("#")))
