"""realtime.voices: the alias table (OpenAI's voice names onto the checkpoint's speakers), its setting and flag."""

from __future__ import annotations

import pytest

from realtime.cli.main import build_parser, server_config
from realtime.config import ServerConfig
from realtime.voices import (
    DEFAULT_VOICE_ALIASES,
    OPENAI_VOICES,
    VoiceTable,
    parse_voice_alias,
    usable_aliases,
    with_aliases,
)

openai = pytest.importorskip("openai")


def test_the_default_table_maps_every_openai_voice_to_a_qwen_speaker():
    """Every built-in voice of the SDK's ``Voice`` literal is in the table, onto Chelsie or Ethan."""
    from typing import get_args

    from openai.types.realtime.realtime_audio_config_output_param import Voice

    sdk_names = next(set(get_args(arg)) for arg in get_args(Voice) if get_args(arg))
    assert sdk_names == set(OPENAI_VOICES) == {name for name, _ in DEFAULT_VOICE_ALIASES}
    assert {speaker for _, speaker in DEFAULT_VOICE_ALIASES} == {"Chelsie", "Ethan"}
    assert ServerConfig().voice_aliases == DEFAULT_VOICE_ALIASES


def test_resolution_prefers_speakers_and_keeps_the_clients_spelling_of_an_alias():
    table = VoiceTable(("Chelsie", "Ethan"), (("marin", "Chelsie"), ("ethan", "Chelsie")))
    assert table.resolve("chelsie") == ("Chelsie", "Chelsie")
    assert table.resolve("ETHAN") == ("Ethan", "Ethan")  # a speaker's own name wins over an alias
    assert table.resolve("Marin") == ("Marin", "Chelsie")
    assert table.resolve("nova") is None


def test_aliases_to_speakers_the_model_lacks_are_set_apart():
    usable, unusable = usable_aliases((("alloy", "chelsie"), ("echo", "Bob")), ("Chelsie", "Ethan"))
    assert usable == (("alloy", "Chelsie"),) and unusable == (("echo", "Bob"),)


def test_voice_alias_flags_add_to_or_replace_entries_of_the_default_table():
    args = build_parser().parse_args(["serve", "--voice-alias", "marin=Ethan", "--voice-alias", " nova = Chelsie "])
    table = dict(server_config(args).voice_aliases)
    assert table["marin"] == "Ethan" and table["nova"] == "Chelsie" and table["cedar"] == "Ethan"
    assert len(table) == len(DEFAULT_VOICE_ALIASES) + 1
    assert with_aliases((("a", "X"),), [("A", "Y")]) == (("A", "Y"),)


@pytest.mark.parametrize("text", ["marin", "=Chelsie", "marin=", " = "])
def test_a_malformed_voice_alias_is_a_usage_error(text, capsys):
    with pytest.raises(ValueError, match="NAME=SPEAKER"):
        parse_voice_alias(text)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--voice-alias", text])
    assert "NAME=SPEAKER" in capsys.readouterr().err


@pytest.mark.parametrize(
    "aliases",
    [(("marin", "Chelsie"), ("MARIN", "Ethan")), (("marin", ""),), (("marin",),), ["marin=Chelsie"]],
)
def test_the_setting_refuses_a_malformed_table(aliases):
    with pytest.raises(ValueError, match="voice_aliases"):
        ServerConfig(voice_aliases=aliases)
