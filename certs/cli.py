"""`gpu-admission certs ...`: make, rotate, inspect and publish the webhook's TLS certificates.

    certs init   --service S --namespace N --out DIR [--ip IP ...] [--dns NAME ...] [--key-type ecdsa|rsa]
                 [--rsa-bits 2048|3072] [--days N] [--ca-days N] [--cluster-domain D] [--force]
    certs rotate --dir DIR [--renew-before 30d] [--ca-renew-before 90d] [--force] [--force-ca] [--days N]
    certs inject --ca-bundle FILE --webhook-name NAME [NAME ...] [--kubeconfig K] [--context C]
    certs secret --dir DIR --name N --namespace NS [--include-ca] [--kubeconfig K] [--context C] [--print]
    certs fetch  --name N --namespace NS --out DIR [--missing-ok] [--force] [--kubeconfig K] [--context C]
    certs show   --dir DIR [--json]

Exit codes: 0 done; 1 the chain does not verify or the certificate expired (`show`), the API server refused
or could not be reached (`inject`, `secret`, `fetch`), or the Secret is missing (without `--missing-ok`) or
unusable (`fetch`); 2 bad input, one line on stderr. Private keys are never printed, except inside the Secret
manifest that `secret --print` writes to stdout on request.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from certs.authority import DEFAULT_CLUSTER_DOMAIN, parse_ip, validate_dns_name
from certs.errors import CertError
from certs.keys import RSA_SIZES, KeyType, describe_key
from certs.rotation import DEFAULT_CA_RENEW_BEFORE, DEFAULT_RENEW_BEFORE, init_dir, rotate
from certs.status import common_name, san_names
from webhook.cli import UsageError

_DURATION = re.compile(r"^(\d+)\s*([wdhms]?)$")
_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds", "": "days"}
_MAX_DAYS = 36500
_KUBECONFIG_HELP = "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class _Parser(argparse.ArgumentParser):
    """Errors are one line (no usage block), and stray arguments are reported by the sub-command itself."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def parse_duration(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `3600s`, `2w`; a bare number is days."""
    match = _DURATION.match(text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 30d, 12h, 90m")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _days(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of days {text!r}") from None
    if not 1 <= value <= _MAX_DAYS:
        raise argparse.ArgumentTypeError(f"days must be between 1 and {_MAX_DAYS}, not {value}")
    return value


def _dns(text: str) -> str:
    try:
        return validate_dns_name(text)
    except CertError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ip(text: str) -> str:
    try:
        return str(parse_ip(text))
    except CertError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fmt(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _left(moment: datetime) -> str:
    seconds = (moment - datetime.now(UTC)).total_seconds()
    if seconds <= 0:
        return "expired"
    return f"{seconds / 86400:.0f} days left" if seconds >= 2 * 86400 else f"{seconds / 3600:.1f} hours left"


def _no_subcommand(args: argparse.Namespace) -> int:
    raise UsageError("certs needs a sub-command: init, rotate, inject, secret, fetch or show")


# -- handlers --------------------------------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    try:
        result = init_dir(
            args.out,
            service=args.service,
            namespace=args.namespace,
            extra_dns=args.dns,
            ips=args.ip,
            cluster_domain=args.cluster_domain,
            key_type=args.key_type,
            rsa_bits=args.rsa_bits,
            validity=timedelta(days=args.days),
            ca_validity=timedelta(days=args.ca_days),
            overwrite=args.force,
        )
    except CertError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {', '.join(str(p) for p in result.files)}")
    print(
        f"CA       {common_name(result.ca)} ({describe_key(result.ca)}), "
        f"valid until {_fmt(result.ca.not_valid_after_utc)}"
    )
    print(
        f"serving  {common_name(result.serving)} ({describe_key(result.serving)}), "
        f"valid until {_fmt(result.serving.not_valid_after_utc)}"
    )
    print(f"SANs     {', '.join(san_names(result.serving))}")
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    try:
        result = rotate(
            args.dir,
            args.renew_before,
            ca_renew_before=args.ca_renew_before,
            force=args.force,
            force_ca=args.force_ca,
            validity=timedelta(days=args.days) if args.days else None,
        )
    except CertError as exc:
        raise UsageError(str(exc)) from None
    for action in result.actions:
        print(action)
    if result.bundle_changed:
        print(
            "the CA bundle changed: run `gpu-admission certs inject --ca-bundle "
            f"{Path(args.dir) / 'ca-bundle.crt'} ...` before the server loads the new certificate"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from certs.status import cert_status

    try:
        status = cert_status(args.dir)
    except CertError as exc:
        raise UsageError(str(exc)) from None
    now = datetime.now(UTC)
    ok = status.ready(now)
    if args.json:
        out: dict[str, Any] = {
            "subject": status.subject,
            "issuer": status.issuer,
            "key": status.key,
            "dnsNames": list(status.dns_names),
            "ipAddresses": list(status.ip_addresses),
            "notBefore": _fmt(status.not_before),
            "notAfter": _fmt(status.not_after),
            "chainOk": status.chain_ok,
            "chainError": status.chain_error,
            "ready": ok,
            "bundle": [
                {"subject": e.subject, "notAfter": _fmt(e.not_after), "expired": e.expired} for e in status.bundle
            ],
        }
        print(json.dumps(out, indent=2))
        return 0 if ok else 1
    print(f"subject     {status.subject}")
    print(f"issuer      {status.issuer}")
    print(f"key         {status.key}")
    print(f"SANs        {', '.join(status.sans)}")
    print(f"not before  {_fmt(status.not_before)}")
    print(f"not after   {_fmt(status.not_after)} ({_left(status.not_after)})")
    print(f"chain       {'ok' if status.chain_ok else status.chain_error}")
    print(f"bundle      {len(status.bundle)} CA certificate(s)")
    for entry in status.bundle:
        flag = " EXPIRED" if entry.expired else ""
        print(f"  - {entry.subject}, until {_fmt(entry.not_after)}{flag}")
    return 0 if ok else 1


def _client(args: argparse.Namespace) -> Any:
    from cluster.kubeclient import KubeClient, KubeConfigError

    try:
        return KubeClient.from_config(args.kubeconfig, context=args.context)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None


def _api_error(exc: object) -> int:
    print(f"gpu-admission: error: {exc}", file=sys.stderr)
    return 1


def cmd_inject(args: argparse.Namespace) -> int:
    from certs.publish import inject_ca_bundle, read_bundle_bytes
    from cluster.kubeclient import KubeError

    try:
        bundle = read_bundle_bytes(args.ca_bundle)
    except CertError as exc:
        raise UsageError(str(exc)) from None
    client = _client(args)
    try:
        results = inject_ca_bundle(client, args.webhook_name, bundle)
    except CertError as exc:
        raise UsageError(str(exc)) from None
    except KubeError as exc:
        return _api_error(exc)
    finally:
        client.close()
    for result in results:
        if result.patched:
            print(f"{result.kind} {result.name}: caBundle set for {', '.join(result.patched)}")
        else:
            print(f"{result.kind} {result.name}: caBundle already current")
    return 0


def _check_secret_name(name: str, namespace: str) -> None:
    from certs.authority import validate_namespace

    validate_namespace(namespace)
    if not _SECRET_NAME.match(name):
        raise CertError(f"invalid Secret name {name!r}")


def cmd_secret(args: argparse.Namespace) -> int:
    try:
        _check_secret_name(args.name, args.namespace)
        from certs.publish import tls_secret

        secret = tls_secret(args.dir, name=args.name, namespace=args.namespace, include_ca=args.include_ca)
    except CertError as exc:
        raise UsageError(str(exc)) from None
    if args.print:
        from certs.publish import secret_yaml

        sys.stdout.write(secret_yaml(secret))
        return 0
    from certs.publish import apply_secret
    from cluster.kubeclient import KubeError

    client = _client(args)
    try:
        outcome = apply_secret(client, secret)
    except CertError as exc:
        raise UsageError(str(exc)) from None
    except KubeError as exc:
        return _api_error(exc)
    finally:
        client.close()
    with_ca = ", with ca.key and ca-bundle.crt" if args.include_ca else ""
    print(f"Secret {args.namespace}/{args.name} (kubernetes.io/tls{with_ca}) {outcome}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from certs.fetch import check_target, fetch_secret_material, write_material
    from cluster.kubeclient import KubeError

    where = f"Secret {args.namespace}/{args.name}"
    try:
        _check_secret_name(args.name, args.namespace)
        check_target(args.out, replace=args.force)  # before any API call: a refusal costs nothing
    except CertError as exc:
        raise UsageError(str(exc)) from None
    client = _client(args)
    try:
        files = fetch_secret_material(client, name=args.name, namespace=args.namespace)
    except (KubeError, CertError) as exc:  # refused, unreachable, or a Secret we cannot use: exit 1
        return _api_error(exc)
    finally:
        client.close()
    if files is None:
        if args.missing_ok:
            print(f"{where} not found: nothing fetched")
            return 0
        return _api_error(f"{where} not found")
    try:
        written, removed = write_material(args.out, files, replace=args.force)
    except CertError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {', '.join(str(p) for p in written)} from {where}")
    if removed:
        print(f"removed {', '.join(str(p) for p in removed)} (not in the Secret)")
    return 0


# -- registration ----------------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="make, rotate, inspect and publish the webhook's TLS certificates",
        description="Make, rotate, inspect and publish the webhook's TLS certificates.",
    )
    parser.set_defaults(func=_no_subcommand)
    sub = parser.add_subparsers(dest="certs_command", metavar="SUBCOMMAND", parser_class=_Parser)

    init = sub.add_parser("init", help="create a CA and a serving certificate for the Service")
    init.add_argument("--service", required=True, help="the webhook's Service name")
    init.add_argument("--namespace", required=True, help="the Service's namespace")
    init.add_argument("--out", required=True, type=Path, help="directory to write into (created 0700)")
    init.add_argument("--ip", action="append", default=[], type=_ip, help="extra IP SAN (repeatable)")
    init.add_argument("--dns", action="append", default=[], type=_dns, help="extra DNS SAN (repeatable)")
    init.add_argument("--key-type", choices=[k.value for k in KeyType], default=KeyType.ECDSA.value)
    init.add_argument("--rsa-bits", type=int, choices=RSA_SIZES, default=2048, help="RSA key size")
    init.add_argument("--days", type=_days, default=365, help="serving certificate validity (default 365)")
    init.add_argument("--ca-days", type=_days, default=3650, help="CA validity (default 3650)")
    init.add_argument("--cluster-domain", type=_dns, default=DEFAULT_CLUSTER_DOMAIN)
    init.add_argument("--force", action="store_true", help="replace existing files")
    init.set_defaults(func=cmd_init)

    rot = sub.add_parser("rotate", help="renew the serving certificate (and roll the CA over) when due")
    rot.add_argument("--dir", required=True, type=Path)
    rot.add_argument(
        "--renew-before",
        type=parse_duration,
        default=DEFAULT_RENEW_BEFORE,
        help="renew the serving certificate this long before it expires (default 30d)",
    )
    rot.add_argument(
        "--ca-renew-before",
        type=parse_duration,
        default=DEFAULT_CA_RENEW_BEFORE,
        help="roll the CA over this long before it expires (default 90d)",
    )
    rot.add_argument("--force", action="store_true", help="renew the serving certificate now")
    rot.add_argument("--force-ca", action="store_true", help="roll the CA over now")
    rot.add_argument("--days", type=_days, help="validity of a renewed certificate (default: as before)")
    rot.set_defaults(func=cmd_rotate)

    inj = sub.add_parser("inject", help="set caBundle in our webhook configurations")
    inj.add_argument("--ca-bundle", required=True, type=Path, help="PEM bundle (ca-bundle.crt)")
    inj.add_argument(
        "--webhook-name",
        required=True,
        action="extend",
        nargs="+",
        help="Mutating/ValidatingWebhookConfiguration name (repeatable)",
    )
    inj.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    inj.add_argument("--context", help="kubeconfig context (default: current-context)")
    inj.set_defaults(func=cmd_inject)

    sec = sub.add_parser("secret", help="create or update the kubernetes.io/tls Secret")
    sec.add_argument("--dir", required=True, type=Path)
    sec.add_argument("--name", required=True)
    sec.add_argument("--namespace", required=True)
    sec.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    sec.add_argument("--context", help="kubeconfig context (default: current-context)")
    sec.add_argument(
        "--include-ca",
        action="store_true",
        help="also store ca.key and ca-bundle.crt, so that a later `certs fetch` + `certs rotate` can renew",
    )
    sec.add_argument("--print", action="store_true", help="write the Secret YAML to stdout, call no API")
    sec.set_defaults(func=cmd_secret)

    fetch = sub.add_parser("fetch", help="read the material back from the kubernetes.io/tls Secret into a directory")
    fetch.add_argument("--name", required=True, help="the Secret's name")
    fetch.add_argument("--namespace", required=True, help="the Secret's namespace")
    fetch.add_argument("--out", required=True, type=Path, help="directory to write into (created 0700)")
    fetch.add_argument(
        "--missing-ok", action="store_true", help="a missing Secret is not an error: write nothing, exit 0"
    )
    fetch.add_argument(
        "--force",
        action="store_true",
        help="replace existing files; those the Secret lacks are removed, so the directory matches the Secret",
    )
    fetch.add_argument("--kubeconfig", help=_KUBECONFIG_HELP)
    fetch.add_argument("--context", help="kubeconfig context (default: current-context)")
    fetch.set_defaults(func=cmd_fetch)

    show = sub.add_parser("show", help="subject, SANs, expiry and chain of the serving certificate")
    show.add_argument("--dir", required=True, type=Path)
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=cmd_show)
