"""The ``swin`` command line tool and its subcommands."""
