"""The mark names the scheduler writes and the checks and code generation read."""
from __future__ import annotations

import pytest

from polyc.marks import (RegisterMark, private_mark, private_positions, register_mark)


@pytest.mark.parametrize("mark", [
    RegisterMark("S1", (8, 64), 512),
    RegisterMark("S_2", (6, 4, 16), 256, init="S0"),
    RegisterMark("S3", (14,), 512, init="", epilogue="S4"),
    RegisterMark("S5", (4, 64), 512, init="S0", epilogue="S6", quad=True),
])
def test_register_marks_read_back_as_written(mark):
    assert register_mark(mark.name) == mark


def test_register_mark_names():
    assert RegisterMark("S1", (8, 64), 512).name == "register:S1:8,64:512"
    assert RegisterMark("S1", (8, 64), 512, "S0", "S2", True).name == \
        "register:S1:8,64:512q:S0:S2"
    for other in ("parallel", "register", "register:S1:8,x:512", "register:S1:8:512:a:b:c",
                  "registers:S1:8:512", "private:1"):
        assert register_mark(other) is None


def test_private_marks_with_and_without_the_depth_tag():
    assert private_mark((3, 5)) == "private:3,5"
    assert private_positions("private:3,5") == [3, 5]
    assert private_positions("private:3,5@2") == [3, 5]
    assert private_positions("private:") == []
    assert private_positions("private:a") is None
    assert private_positions("private:3,,5") is None and private_positions("private:,") is None
    assert private_positions("parallel") is None
