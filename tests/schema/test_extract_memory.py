"""``schema extract`` holds one copy of its input and little more (issue 35: a 100 MB one-line bundle
took 1.8 GB). A 5 MB one-line bundle of minified code — lowered protobuf-es v1 classes and
``makeMessageType`` calls among plain functions full of braces, strings, template literals, regex
literals and divisions — is extracted under tracemalloc; the peak stays below 2× the input (the text itself is 1×; 2.5× before). Not
timed (benchmarks/schema_extract.py --one-line gives the time and RSS of 100 MB)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from workbench.schema.extract import extract

SCHEMA = ('var Ab=class i extends Msg{constructor(e){super();this.name="";this.items=[];pb.util.initPartial(e,this)}'
          'static fromBinary(e,t){return new i().fromBinary(e,t)}};Ab.runtime=pb;Ab.typeName="agent.v1.Item";'
          'Ab.fields=pb.util.newFieldList(()=>[{no:1,name:"name",kind:"scalar",T:9},'
          '{no:2,name:"items",kind:"scalar",T:5,repeated:!0}]);'
          'var Cd=pb.makeMessageType("agent.v1.Box",()=>[{no:1,name:"item",kind:"message",T:Ab},'
          '{no:2,name:"count",kind:"scalar",T:3}]);')
CODE = ('function f{n}(a,b){{var c={{x:a/2,y:"}}"+b,z:[1,2,3]}};if(c.x){{for(let k=0;k<9;k++){{c.x+=k}}}}'
        'return c.x>1?c.y:/a{{2}}b/.test(b)?`t${{a}}`:a/b/2}}')


def one_line_bundle(path: Path, size: int) -> Path:
    """Scopes of minified code on one line, every 50th holding the schema, up to ``size`` bytes."""
    parts: list[str] = []
    total = i = 0
    while total < size:
        chunk = "(()=>{" + (SCHEMA if i % 50 == 0 else CODE.format(n=i)) + "})();"
        parts.append(chunk)
        total += len(chunk)
        i += 1
    path.write_text("".join(parts))
    return path


def test_extract_of_a_5mb_one_line_bundle_stays_small(tmp_path: Path) -> None:
    bundle = one_line_bundle(tmp_path / "app.js", 5_000_000)
    size = bundle.stat().st_size
    tracemalloc.start()
    try:
        ex = extract([bundle])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"extract of a {size:,}-byte one-line bundle: peak {peak:,} bytes traced ({peak / size:.2f}× the input)")
    assert ex.counts()["messages"] == 2
    assert peak < 2 * size
