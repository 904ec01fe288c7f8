"""`python -m webhook` is the same as the `gpu-admission` command."""

from webhook.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
