"""Rows of the SWE-bench family, mapped to our task fields by their published schemas.

    SWE-Gym     (SWE-Gym/SWE-Gym)       SWE-bench's own fields: loads as it is.
    SWE-rebench (nebius/SWE-rebench)    SWE-bench's fields + install_config, requirements,
                                        environment, meta, license_name, docker_image.
    SWE-smith   (SWE-bench/SWE-smith)   instance_id, repo, patch, FAIL_TO_PASS, PASS_TO_PASS,
                                        image_name, problem_statement. Its `patch` *introduces*
                                        the bug (the gold fix is its reverse), and it has no
                                        base_commit or test_patch.
    R2E-Gym     (R2E-Gym/R2E-Gym-*)     repo_name, docker_image, commit_hash,
                                        parsed_commit_content, execution_result_content,
                                        modified_files, relevant_files, prompt,
                                        problem_statement, expected_output_json, ...

`normalise(row)` returns the row in our fields plus one note per published field we cannot
honour (the loader logs each as a warning: never silently dropped). Fields that carry no
meaning for grading (`created_at`, `hints_text`, `meta`, `license_name`, R2E-Gym's
statistics) are left out without a note. What our task needs and a family does not
publish (SWE-smith's base commit, R2E-Gym's tests) must be added to the row: the loader's
error names the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

SILENT = frozenset(
    {
        "created_at",
        "hints_text",
        "meta",
        "license_name",
        "num_non_test_files",
        "num_non_test_func_methods",
        "num_non_test_lines",
        "modified_entity_summaries",
        "modified_files",
        "relevant_files",
    }
)


def detect(row: dict[str, Any]) -> str:
    """The family of a row: swe-smith, r2e-gym, swe-rebench or swe-bench (incl. SWE-Gym)."""
    if "repo_name" in row and "commit_hash" in row:
        return "r2e-gym"
    if "image_name" in row and "test_patch" not in row:
        return "swe-smith"
    if any(k in row for k in ("install_config", "license_name", "environment")):
        return "swe-rebench"
    return "swe-bench"


def reverse_diff(diff: str) -> str:
    """A unified git diff undone: what SWE-smith's bug-introducing `patch` is to the fix."""
    out = []
    hunk = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            a, b = ln[4:], lines[i + 1][4:]
            out += ["--- " + b.replace("b/", "a/", 1), "+++ " + a.replace("a/", "b/", 1)]
            i += 2
            continue
        m = hunk.match(ln.rstrip("\n"))
        if m:
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}\n")
        elif ln.startswith("new file mode"):
            out.append(ln.replace("new file mode", "deleted file mode"))
        elif ln.startswith("deleted file mode"):
            out.append(ln.replace("deleted file mode", "new file mode"))
        elif ln.startswith("+") and not ln.startswith("+++"):
            out.append("-" + ln[1:])
        elif ln.startswith("-") and not ln.startswith("---"):
            out.append("+" + ln[1:])
        else:
            out.append(ln)
        i += 1
    return "".join(out)


def _r2e_tests(row: dict[str, Any]) -> tuple[list[str], list[str]] | None:
    """FAIL_TO_PASS / PASS_TO_PASS from R2E-Gym's execution results (old vs new commit)."""
    try:
        res = row["execution_result_content"]
        res = json.loads(res) if isinstance(res, str) else res
        old = res["old_commit_res_map"]
        new = res["new_commit_res_map"]
        old = json.loads(old) if isinstance(old, str) else old
        new = json.loads(new) if isinstance(new, str) else new
    except (KeyError, TypeError, ValueError):
        return None
    f2p = sorted(t for t, s in new.items() if s == "PASSED" and old.get(t) != "PASSED")
    p2p = sorted(t for t, s in new.items() if s == "PASSED" and old.get(t) == "PASSED")
    return f2p, p2p


def normalise(row: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """(the row in our fields, one note per field we cannot honour)."""
    family = detect(row)
    notes: list[str] = []
    if family == "swe-bench":  # our own format (SWE-Gym's rows are SWE-bench's): as before
        return row, notes
    out = {k: v for k, v in row.items() if k not in SILENT}
    if family == "swe-rebench":
        for key, why in (
            ("install_config", "its install recipe is not run (use env_setup / requirements of our format)"),
            ("environment", "its environment spec is not built"),
            ("environment_setup_commit", "the task image is built at base_commit"),
        ):
            if row.get(key) and not (key == "environment_setup_commit" and row[key] == row.get("base_commit")):
                notes.append(f"{where}: SWE-rebench field {key!r} not honoured: {why}")
            out.pop(key, None)
        if isinstance(row.get("requirements"), str):  # a pip freeze text, not our list of wheels
            notes.append(f"{where}: SWE-rebench field 'requirements' (pip freeze text) not honoured: not installed")
            out.pop("requirements")
        if row.get("docker_image") and not row.get("image"):
            out["image"] = row["docker_image"]
        out.pop("docker_image", None)
    elif family == "swe-smith":
        out["patch"] = reverse_diff(row.get("patch") or "")
        out.setdefault("test_patch", "")
        if row.get("image_name") and not row.get("image"):
            out["image"] = row["image_name"]
        out.pop("image_name", None)
        if not row.get("base_commit"):
            notes.append(
                f"{where}: SWE-smith publishes no base_commit (the bug is on branch {row.get('instance_id')!r} of its "
                "mirror repository): add 'base_commit' (that branch's commit) to the row"
            )
    elif family == "r2e-gym":
        out.pop("repo_name", None)
        out.pop("commit_hash", None)
        out["repo"] = row["repo_name"]
        out.setdefault("instance_id", f"{row['repo_name']}__{str(row['commit_hash'])[:12]}")
        if row.get("docker_image") and not row.get("image"):
            out["image"] = row["docker_image"]
        out.pop("docker_image", None)
        tests = _r2e_tests(row)
        if tests is not None and "FAIL_TO_PASS" not in row:
            out["FAIL_TO_PASS"], out["PASS_TO_PASS"] = tests
        for key in ("parsed_commit_content", "execution_result_content", "expected_output_json", "prompt"):
            out.pop(key, None)
        if "patch" not in row:
            notes.append(
                f"{where}: R2E-Gym field 'parsed_commit_content' not honoured: add the gold fix as 'patch' (a git diff)"
            )
        if not row.get("base_commit"):
            notes.append(
                f"{where}: R2E-Gym publishes the fix commit {row['commit_hash']!r}, not its parent: add 'base_commit'"
            )
        out.setdefault("test_patch", "")
        notes.append(
            f"{where}: R2E-Gym field 'expected_output_json' not honoured: graded by FAIL_TO_PASS/PASS_TO_PASS only"
        )
    return out, notes
