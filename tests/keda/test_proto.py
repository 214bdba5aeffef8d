"""predictive_scaler/keda/externalscaler.proto is KEDA's wire contract, field for field.

Compared with KEDA's own file (fixtures/upstream_externalscaler.proto, main at 8b4f083; SOURCE.md)
as protoc reads them: package, every message's fields (name, number, type, label), every RPC
(name, request, response, streaming). Comments and option go_package may differ.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def contract(proto: Path, tmp: Path) -> dict[str, Any]:
    out = tmp / f"{proto.stem}.pb"
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
                           f"--descriptor_set_out={out}", str(proto)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    [f] = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file

    def message(m: Any) -> Any:
        return ({(x.name, x.number, x.type, x.label, x.type_name) for x in m.field},
                {n.name: message(n) for n in m.nested_type})

    return {"package": f.package, "messages": {m.name: message(m) for m in f.message_type},
            "services": {s.name: {(r.name, r.input_type, r.output_type, r.client_streaming, r.server_streaming)
                                  for r in s.method} for s in f.service}}


def test_the_proto_is_kedas_contract(tmp_path: Path) -> None:
    ours = contract(ROOT / "predictive_scaler" / "keda" / "externalscaler.proto", tmp_path)
    theirs = contract(HERE / "fixtures" / "upstream_externalscaler.proto", tmp_path)
    assert ours == theirs
    # What 2.12–2.16 read, and the float fields 2.17 added: numbers 2 and 3 of the two messages.
    fields = {name: {f[0]: f[1] for f in ours["messages"][name][0]} for name in ("MetricSpec", "MetricValue")}
    assert fields == {"MetricSpec": {"metricName": 1, "targetSize": 2, "targetSizeFloat": 3},
                      "MetricValue": {"metricName": 1, "metricValue": 2, "metricValueFloat": 3}}
