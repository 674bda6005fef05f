"""Settings in one place: `settings.py` (the one `Settings` object and where each value comes
from), `names.py` (a setting's flag and environment variable), `groups.py` (the groups they are
shown in), `flags.py` (settings as command-line flags, and the parser every command uses),
`errors.py` (settings errors as a person reads them), `reference.py` (the documentation's
settings page) and `options.py` (the options each part below the CLI takes, cut from the
settings). The package imports nothing itself."""
