"""Named exit codes shared by every command (documented in the README)."""

EXIT_OK = 0
#: A check failed, a reload failed, or the command could not do what was asked.
EXIT_FAILURE = 1
#: The config file or the command line is wrong.
EXIT_USAGE = 2
#: The environment cannot run the command (no session running, missing library, ...).
EXIT_ENVIRONMENT = 3
#: Interrupted by SIGINT before finishing.
EXIT_INTERRUPTED = 130
