#!/usr/bin/env python3
"""Make Debian's kubernetes 1.20.2 source build and run with Go 1.19.

Kubernetes 1.20 was released with Go 1.15. Two vendored libraries rely on
behaviour that changed since, and one generated file is missing from the
tarball (the third fix runs in build-kube-apiserver.sh, it needs the tree's
own openapi-gen). Each edit checks it finds the text it expects, so a
different source version fails loudly instead of building something broken.

Usage: go119_fixes.py <kubernetes source tree>
"""

from __future__ import annotations

import sys
from pathlib import Path

REFLECT2_LINK = "vendor/github.com/modern-go/reflect2/unsafe_link.go"
REFLECT2_MAP = "vendor/github.com/modern-go/reflect2/unsafe_map.go"
OPENAPI_TYPE = "vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go"

# Since Go 1.18 the runtime's reflect.mapiterinit fills an iterator the caller
# allocates instead of returning one it allocated. The caller's struct must be
# as large as the runtime's: two leading pointers the caller reads, then the
# runtime's own bookkeeping (6 pointers, 1 uintptr, 4 bytes, 2 uintptrs).
NEW_DECL = """//go:noescape
//go:linkname mapiterinit reflect.mapiterinit
func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer, it *hiter)
"""

NEW_HITER = """// hiter mirrors the layout of the Go 1.18+ runtime's map iterator
// (runtime/map.go). The runtime writes every field, so the size must match;
// only key and value are read here.
type hiter struct {
	key         unsafe.Pointer
	value       unsafe.Pointer
	t           unsafe.Pointer
	h           unsafe.Pointer
	buckets     unsafe.Pointer
	bptr        unsafe.Pointer
	overflow    unsafe.Pointer
	oldoverflow unsafe.Pointer
	startBucket uintptr
	offset      uint8
	wrapped     bool
	B           uint8
	i           uint8
	bucket      uintptr
	checkBucket uintptr
}
"""


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if new in text:
        return  # already applied
    count = text.count(old)
    if count != 1:
        sys.exit(f"go119_fixes: expected one match in {path}, found {count}: {old[:60]!r}")
    path.write_text(text.replace(old, new))


def fix_reflect2(root: Path) -> None:
    link = root / REFLECT2_LINK
    text = link.read_text()
    start = text.index("//go:noescape\n//go:linkname mapiterinit")
    end = text.index("\n", text.index("func mapiterinit", start)) + 1
    if "it *hiter)" not in text[start:end]:
        text = text[:start] + NEW_DECL + text[end:]
    h_start = text.index("type hiter struct {")
    h_start = text.rindex("\n\n", 0, h_start) + 2
    h_end = text.index("\n}\n", h_start) + 3
    text = text[:h_start] + NEW_HITER + text[h_end:]
    link.write_text(text)
    replace_once(
        root / REFLECT2_MAP,
        "\treturn &UnsafeMapIterator{\n"
        "\t\thiter:      mapiterinit(type2.rtype, *(*unsafe.Pointer)(obj)),\n"
        "\t\tpKeyRType:  type2.pKeyRType,\n"
        "\t\tpElemRType: type2.pElemRType,\n"
        "\t}\n",
        "\tit := &UnsafeMapIterator{\n"
        "\t\thiter:      new(hiter),\n"
        "\t\tpKeyRType:  type2.pKeyRType,\n"
        "\t\tpElemRType: type2.pElemRType,\n"
        "\t}\n"
        "\tmapiterinit(type2.rtype, *(*unsafe.Pointer)(obj), it.hiter)\n"
        "\treturn it\n",
    )


def fix_openapi_null(root: Path) -> None:
    # Go 1.19 backs every empty string in an interface with the same zero
    # buffer, so "is it the reflect zero value" also matches "" and a CRD's
    # `default: ''` gets "must be of type string: null". Only nil is null.
    replace_once(
        root / OPENAPI_TYPE,
        "if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {",
        "if data == nil {",
    )


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = Path(sys.argv[1])
    fix_reflect2(root)
    fix_openapi_null(root)


if __name__ == "__main__":
    main()
