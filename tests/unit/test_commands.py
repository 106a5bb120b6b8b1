"""Plugin commands (``etsdk_register_commands``) through real entry points of real (fixture) distributions."""

from __future__ import annotations

import json

import pytest
from etsdk.testing import PluginSite

from tests.conftest import plugins_json

HELLO = """
    import logging
    from etsdk import CommandSpec, EtsdkError, hookimpl
    ETSDK_PLUGIN_API = ">=2,<3"

    def configure(parser):
        parser.add_argument("who")
        parser.add_argument("--status", type=int, default=0)
        parser.add_argument("--fail", action="store_true")
        parser.add_argument("--verbose", action="store_true")

    def run(args):
        if args.fail:
            raise EtsdkError(f"{args.who} refused")
        print(f"hello {args.who}; logging disabled below {logging.root.manager.disable}")
        return args.status

    @hookimpl
    def etsdk_register_commands():
        return [CommandSpec(name="{name}", help="say hello (a fixture plugin's command)", configure=configure, run=run,
                            quiet={quiet})]
"""


def hello(name: str = "hello", quiet: bool = True) -> str:
    return HELLO.replace("{name}", name).replace("{quiet}", str(quiet))


def test_a_plugin_command_is_listed_in_help_and_runs(site: PluginSite) -> None:
    site.add("hello-dist", hello(), plugin="hello")
    helped = site.run_etsdk(["--help"])
    assert helped.returncode == 0, helped.stderr
    assert "say hello (a fixture plugin's command)" in helped.stdout
    assert "verify" in helped.stdout and "export" in helped.stdout  # the core's and etsdk-hf-static's stay
    ran = site.run_etsdk(["hello", "world", "--status", "3"])
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, "hello world; logging disabled below 30\n", "")  # quiet=True
    loud = site.run_etsdk(["hello", "world", "--verbose"])
    assert (loud.returncode, loud.stdout) == (0, "hello world; logging disabled below 0\n")
    failed = site.run_etsdk(["hello", "world", "--fail"])
    assert (failed.returncode, failed.stdout, failed.stderr) == (2, "", "etsdk: error: world refused\n")
    usage = site.run_etsdk(["hello"])
    assert usage.returncode == 2 and "the following arguments are required: who" in usage.stderr
    entry = plugins_json(site)["hello"]
    assert entry["status"] == "ok" and entry["commands"] == ["hello"] and entry["refused"] == []
    table = site.run_etsdk(["plugins"])
    row = next(line for line in table.stdout.splitlines() if line.startswith("hello "))
    assert row.split()[-1] == "hello"  # the COMMANDS column


def test_quiet_false_leaves_logging_alone(site: PluginSite) -> None:
    site.add("hello-dist", hello(quiet=False), plugin="hello")
    ran = site.run_etsdk(["hello", "you"])
    assert (ran.returncode, ran.stdout) == (0, "hello you; logging disabled below 0\n"), ran.stderr


def test_a_command_named_like_a_core_command_is_refused_and_reported(site: PluginSite) -> None:
    site.add("taker-dist", hello("verify"), plugin="taker")
    site.add("fine-dist", hello("fine"), plugin="fine")
    entry = plugins_json(site)["taker"]
    assert entry["status"] == "failed"  # its only record was refused
    assert any("command 'verify' belongs to the etsdk core" in r and "taker-dist 1.0" in r for r in entry["refused"])
    table = site.run_etsdk(["plugins"])
    assert "taker: refused: command 'verify' belongs to the etsdk core" in table.stdout
    core = site.run_etsdk(["verify", "--help"])
    assert core.returncode == 0 and "--no-methods" in core.stdout and "who" not in core.stdout
    assert site.run_etsdk(["fine", "x"]).stdout.startswith("hello x")  # the other plugin's command is untouched
    strict = site.run_etsdk(["fine", "x"], {"ETSDK_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2 and "command 'verify' belongs to the etsdk core" in strict.stderr


def test_two_plugins_claiming_one_command_both_lose_it(site: PluginSite) -> None:
    site.add("one-dist", hello("shared"), plugin="one")
    site.add("two-dist", hello("shared"), plugin="two")
    listed = plugins_json(site)
    for name in ("one", "two"):
        assert any("command 'shared' is claimed by both one-dist 1.0" in r for r in listed[name]["refused"]), listed[name]
    ran = site.run_etsdk(["shared", "x"])
    assert ran.returncode == 2 and "invalid choice: 'shared'" in ran.stderr


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (
            """
            from etsdk import CommandSpec, hookimpl
            ETSDK_PLUGIN_API = ">=2,<3"
            @hookimpl
            def etsdk_register_commands():
                return [CommandSpec(name="Not A Name", help="", configure=print, run=print)]
            """,
            "command name must be lowercase words joined by '-'",
        ),
        (
            """
            from etsdk import hookimpl
            ETSDK_PLUGIN_API = ">=2,<3"
            @hookimpl
            def etsdk_register_commands():
                return [{"name": "dict"}]
            """,
            "etsdk_register_commands() returned a dict, expected CommandSpec",
        ),
    ],
    ids=["bad-name", "wrong-record-type"],
)
def test_invalid_command_records_fail_the_plugin(site: PluginSite, source: str, fragment: str) -> None:
    site.add("invalid-dist", source, plugin="invalid")
    entry = plugins_json(site)["invalid"]
    assert entry["status"] == "failed" and fragment in entry["reason"]
    assert site.run_etsdk(["--help"]).returncode == 0


def test_a_command_whose_configure_raises_breaks_only_itself(site: PluginSite) -> None:
    site.add(
        "broken-dist",
        """
        from etsdk import CommandSpec, hookimpl
        ETSDK_PLUGIN_API = ">=2,<3"
        def configure(parser):
            raise RuntimeError("no arguments today")
        @hookimpl
        def etsdk_register_commands():
            return [CommandSpec(name="broken", help="a command that cannot configure", configure=configure, run=print)]
        """,
        plugin="broken",
    )
    site.add("hello-dist", hello(), plugin="hello")
    assert site.run_etsdk(["--help"]).returncode == 0
    assert site.run_etsdk(["hello", "x"]).returncode == 0
    broken = site.run_etsdk(["broken", "x"])
    assert broken.returncode == 2
    assert broken.stderr == (
        "etsdk: error: the 'broken' command of broken-dist 1.0 (plugin 'broken') could not set up its arguments: "
        "RuntimeError: no arguments today\n"
    )


def test_version_and_core_commands_do_not_read_plugin_commands(site: PluginSite) -> None:
    site.add("hello-dist", hello(), plugin="hello", module="hello_commands")
    result = site.run_python(
        """
        import sys
        from etsdk.cli.main import main
        try:
            main(["--version"])
        except SystemExit:
            pass
        print("VERSION", "hello_commands" in sys.modules)
        main(["plugins", "--json"])
        print("PLUGINS", sorted(m for m in ("torch", "executorch") if m in sys.modules))
        """
    )
    lines = result.stdout.splitlines()
    assert "VERSION False" in lines, result.stdout + result.stderr  # --version never discovers plugins
    assert "PLUGINS []" in lines


def test_an_unknown_argument_shows_the_usage_of_its_command(site: PluginSite) -> None:
    """argparse's parse_args reports unknown arguments with the top-level usage; etsdk uses the command's own."""
    site.add("hello-dist", hello(), plugin="hello")
    plugin = site.run_etsdk(["hello", "world", "--top-kk", "40"])
    assert plugin.returncode == 2 and plugin.stdout == ""
    assert plugin.stderr.startswith("usage: etsdk hello [-h] [--status STATUS]"), plugin.stderr
    assert plugin.stderr.endswith("etsdk hello: error: unrecognized arguments: --top-kk 40\n")
    core = site.run_etsdk(["verify", "x.pte", "--bogus"])
    assert core.returncode == 2 and core.stderr.startswith("usage: etsdk verify ")
    assert core.stderr.endswith("etsdk verify: error: unrecognized arguments: --bogus\n")
    top = site.run_etsdk(["--bogus", "plugins"])  # before the command word: the top level's
    assert top.returncode == 2 and top.stderr.startswith("usage: etsdk [-h]")
    assert top.stderr.endswith("etsdk: error: unrecognized arguments: --bogus\n")
    missing = site.run_etsdk(["hello"])  # argparse's own errors of a command were always the command's
    assert missing.stderr.startswith("usage: etsdk hello ") and "required: who" in missing.stderr


def test_the_core_reserves_exactly_its_own_commands() -> None:
    import argparse

    from etsdk._plugins.registry import CORE_COMMANDS
    from etsdk.cli.main import build_parser

    parser = build_parser(plugin_commands=False)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) == CORE_COMMANDS


def test_a_missing_plugin_command_names_the_distribution(site: PluginSite) -> None:
    result = site.run_etsdk(["export", "--model", "m", "-o", "x.pte"], {"ETSDK_DISABLE_PLUGINS": "hf_static"})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("etsdk: error: 'etsdk export' is a command of the etsdk-hf-static plugin")
    assert "pip install etsdk-hf-static" in result.stderr


def test_the_old_chat_module_path_forwards_to_the_plugin(site: PluginSite) -> None:
    result = site.run_python(
        """
        import warnings
        import etsdk
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import etsdk.chat
        import etsdk_hf_static.apps.chat
        print("SAME", etsdk.chat is etsdk_hf_static.apps.chat)
        print("WARNED", [str(w.message) for w in caught if w.category is DeprecationWarning])
        """
    )
    assert "SAME True" in result.stdout, result.stderr
    assert "etsdk.chat moved; import its public names from etsdk_hf_static.apps.chat" in result.stdout
    missing = site.run_python(
        """
        import sys

        class NotInstalled:  # as if etsdk-hf-static were not installed
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "etsdk_hf_static":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NotInstalled())
        import etsdk
        try:
            import etsdk.chat
        except ImportError as exc:
            print("IMPORTERROR", exc)
        """
    )
    assert "IMPORTERROR etsdk.chat moved to etsdk_hf_static.apps.chat" in missing.stdout, missing.stderr
    assert "pip install etsdk-hf-static" in missing.stdout


def test_in_process_plugin_commands_clash_like_installed_ones() -> None:
    import types

    import etsdk

    module = types.ModuleType("inline_commands")
    module.ETSDK_PLUGIN_API = ">=2,<3"  # type: ignore[attr-defined]

    @etsdk.hookimpl
    def etsdk_register_commands() -> list[etsdk.CommandSpec]:
        return [etsdk.CommandSpec(name="doctor", help="", configure=lambda parser: None, run=lambda args: 0)]

    module.etsdk_register_commands = etsdk_register_commands  # type: ignore[attr-defined]
    with pytest.raises(etsdk.PluginConflictError, match="command 'doctor' is already provided"):
        etsdk.register_plugin(module, "inline_commands")
    assert "inline_commands" not in {p.name for p in etsdk.list_plugins()}
    assert json.dumps([p.to_json() for p in etsdk.list_plugins()])  # commands serialise
