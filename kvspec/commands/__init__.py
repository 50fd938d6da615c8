"""The sub-commands of ``kvspec``, one module each (``cmd_verify``, ``cmd_check``, ``cmd_fuzz``,
``cmd_replay``, ``cmd_bench``, ``cmd_admission``, ``cmd_mutants``; ``common`` holds what they
share). Each module has the command's function and an ``add_parser(sub)`` that registers it; the
commands whose logic is one module of its own (``soak``, ``audit``, ``prove``, ``smoke``,
``crosshair``, ``explore``, ``diff``, ``figures``) register from that module.
:func:`kvspec.cli.build_parser` adds them all, in :data:`ORDER`."""

ORDER: tuple[str, ...] = (
    "kvspec.commands.cmd_verify",
    "kvspec.commands.cmd_check",
    "kvspec.commands.cmd_fuzz",
    "kvspec.commands.cmd_replay",
    "kvspec.commands.cmd_bench",
    "kvspec.commands.cmd_admission",
    "kvspec.commands.cmd_mutants",
)
