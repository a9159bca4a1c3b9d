"""Per-test results from a pytest JUnit XML report, keyed by pytest node id.

Why JUnit and not the console log: a patch can print its own `PASSED` lines (SWE-bench's
2026 grader had to learn this the hard way), but it cannot easily write into an XML file
whose path it never sees. The report is still produced by code running next to the
repository's, so it is treated as untrusted input: size-capped, no DTDs or entities, and
any shape we do not recognise is an error rather than a guess.

Node ids are rebuilt from the `file` attribute (written with `junit_family=xunit1`) and the
`classname`: `classname` is the dotted module path followed by the class chain, so removing
the module part leaves the classes. `tests/test_a.py` + `tests.test_a.TestX` + `test_y[1]`
becomes `tests/test_a.py::TestX::test_y[1]`, exactly what pytest prints and what
FAIL_TO_PASS lists hold.
"""

from __future__ import annotations

import enum
import xml.etree.ElementTree as ET

MAX_REPORT_BYTES = 32 * 1024 * 1024


class TestStatus(enum.StrEnum):
    """One test's result. `missing` means the test did not appear in the report at all."""

    __test__ = False  # not a pytest test class, despite the name

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    MISSING = "missing"

    @property
    def ok(self) -> bool:
        """Counts as passing for grading (SWE-bench counts an expected failure as a pass)."""
        return self in (TestStatus.PASSED, TestStatus.XFAILED)


# When a test has several children (e.g. a failure in the call and an error in teardown),
# the worst one decides.
_SEVERITY = {
    TestStatus.PASSED: 0,
    TestStatus.XFAILED: 1,
    TestStatus.SKIPPED: 2,
    TestStatus.FAILED: 3,
    TestStatus.ERROR: 4,
}


class ReportError(ValueError):
    """The report is not a JUnit XML file we can trust (malformed, too big, DTD, …)."""


def node_id(file: str, classname: str, name: str) -> str:
    """Rebuild a pytest node id from the xunit1 attributes of one <testcase>."""
    file = file.replace("\\", "/")
    module = file[:-3] if file.endswith(".py") else file
    dotted = module.replace("/", ".")
    classes = ""
    if classname == dotted:
        classes = ""
    elif classname.startswith(dotted + "."):
        classes = classname[len(dotted) + 1 :]
    else:
        # pytest strips a leading package root in some layouts: fall back to the longest
        # suffix of the dotted module path that prefixes the classname.
        parts = dotted.split(".")
        for i in range(len(parts)):
            suffix = ".".join(parts[i:])
            if classname == suffix:
                break
            if classname.startswith(suffix + "."):
                classes = classname[len(suffix) + 1 :]
                break
    pieces = [file] + ([c for c in classes.split(".") if c] if classes else []) + [name]
    return "::".join(pieces)


def _case_status(case: ET.Element) -> TestStatus:
    status = TestStatus.PASSED
    for child in case:
        tag = child.tag
        if tag == "failure":
            found = TestStatus.FAILED
        elif tag == "error":
            found = TestStatus.ERROR
        elif tag == "skipped":
            found = TestStatus.XFAILED if child.get("type") == "pytest.xfail" else TestStatus.SKIPPED
        else:
            continue  # system-out, system-err, properties
        if _SEVERITY[found] > _SEVERITY[status]:
            status = found
    return status


def parse_junit(data: bytes) -> dict[str, TestStatus]:
    """Parse a JUnit XML report into {node id: status}; raise ReportError if untrustworthy."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"report is {len(data)} bytes, over the {MAX_REPORT_BYTES} limit")
    head = data[:4096].lower()
    if b"<!doctype" in head or b"<!entity" in data.lower():
        raise ReportError("report declares a DTD or entities; a pytest report never does")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise ReportError(f"report is not well-formed XML: {exc}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportError(f"report root is <{root.tag}>, expected <testsuites> or <testsuite>")
    results: dict[str, TestStatus] = {}
    for case in root.iter("testcase"):
        name = case.get("name")
        classname = case.get("classname", "")
        file = case.get("file")
        if not name:
            raise ReportError("a <testcase> has no name")
        if file is None or not classname:
            # A collection error (no class name, sometimes no file): keep it visible under a
            # key no real test can have; the module's tests are missing and so count as failed.
            nid = f"<collection>::{file or ''}::{name}"
        else:
            nid = node_id(file, classname, name)
        status = _case_status(case)
        old = results.get(nid)
        if old is None or _SEVERITY[status] > _SEVERITY[old]:
            results[nid] = status
    return results


def failure_texts(data: bytes, limit: int = 4000) -> dict[str, str]:
    """{node id: failure/error text} for failed tests (used to write problem statements)."""
    root = ET.fromstring(data)
    out: dict[str, str] = {}
    for case in root.iter("testcase"):
        nid = node_id(case.get("file", ""), case.get("classname", ""), case.get("name", ""))
        for child in case:
            if child.tag in ("failure", "error"):
                text = (child.text or child.get("message") or "").strip()
                out[nid] = text[:limit]
                break
    return out
