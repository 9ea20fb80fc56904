"""radixlm/utils.py: what an error text may show a client."""

from __future__ import annotations

import pytest

from radixlm.utils import public_error_text


@pytest.mark.parametrize("raw,clean", [
    ("Failed to compile regex grammar: [09:44:46] /project/cpp/regex_converter.cc:94: "
     "Regex parsing error at position 3: The parenthesis is not closed.\n",
     "Failed to compile regex grammar: Regex parsing error at position 3: The parenthesis "
     "is not closed."),
    ("cannot identify image file <_io.BytesIO object at 0x7fbd6c8644a0>",
     "cannot identify image file <_io.BytesIO object>"),
    ("boom Traceback (most recent call last):\n  File \"/a/b.py\", line 3, in f\nValueError: x",
     "boom"),
    ('failed in File "/srv/x.py", line 12, in run: bad', "failed in: bad"),
    ("C:\\src\\grammar.cpp:9:2: unexpected token", "unexpected token"),
    ("pointer 0x7ffd12345678 freed", "pointer freed"),
    # What is the user's own input, or no leak, stays.
    ("The path '/etc/passwd' is outside the allowed media folder",
     "The path '/etc/passwd' is outside the allowed media folder"),
    ("Token id 0x10 is outside the vocabulary (size 49152)",
     "Token id 0x10 is outside the vocabulary (size 49152)"),
])
def test_public_error_text(raw: str, clean: str) -> None:
    assert public_error_text(raw) == clean
