"""Names and small inputs (issue 25, point 6): one name rule with no trailing newline or control
characters, odd pcm16 byte counts refused, no object reprs in image errors."""

from __future__ import annotations

import base64

import pytest

from omni.api.errors import ApiError
from omni.api.media import MediaLimits, _check_image
from omni.api.realtime.conversation import pcm16_to_float
from omni.api.voices import check_name


@pytest.mark.parametrize("name", ["abc\n", "abc\r", "a\tb", "abc\x00", "\nabc", ""])
def test_a_voice_name_with_a_control_character_is_refused(name):
    with pytest.raises(ApiError) as err:
        check_name(name)
    assert err.value.status == 400


def test_a_plain_voice_name_is_taken():
    check_name("alice-2.v1")


def test_an_odd_pcm16_byte_count_is_refused():
    with pytest.raises(ApiError) as err:
        pcm16_to_float(b"\x00\x01\x02")
    assert err.value.status == 400 and "3 bytes" in str(err.value)
    assert len(pcm16_to_float(b"\x00\x01\x02\x03")) == 2


def test_an_unreadable_image_error_names_no_object_address():
    with pytest.raises(ApiError) as err:
        _check_image(base64.b64decode("bm90IGFuIGltYWdl"), "image_url", MediaLimits())
    assert " at 0x" not in str(err.value) and "not a readable image" in str(err.value)
