"""TLS certificates for the admission webhook, made with `cryptography` alone.

Modules, one idea each:

| module | what |
|---|---|
| `certs.keys` | key generation (ECDSA P-256 default, RSA 2048/3072), PEM, key/cert matching |
| `certs.authority` | the self-signed CA and serving certificates for a Service (profile in its docstring) |
| `certs.store` | the directory layout (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`, `ca-bundle.crt`), atomic writes |
| `certs.rotation` | `init_dir()` and `rotate()`: leaf renewal, CA rollover with old+new CA in the bundle |
| `certs.status` | SANs, expiry, chain verification against the bundle (for `certs show` and `/readyz`) |
| `certs.tlsconfig` | a TLS 1.2+ server `SSLContext` from a verified pair |
| `certs.publish` | caBundle injection, the `kubernetes.io/tls` Secret (through `cluster.kubeclient`) |
| `certs.cli` | `gpu-admission certs init / rotate / inject / secret / show` |

Only `certs.publish` (and `certs.cli`, lazily, for `inject`/`secret`) imports HTTP code.

Defaults, and how they compare with peers (shared/reference/admission-contract.md):

- CA valid 10 years, serving certificate 1 year: as Gatekeeper and Kubewarden. Kyverno uses a 1-year CA and a
  150-day leaf, which makes its CA rollover a yearly event; "self-managed CA expiring without renewal" is one
  of the pain points peers' users report, so the CA rolls over rarely, and when it does the old CA stays in
  the bundle until it expires (as Kubewarden does).
- The serving certificate is renewed 30 days before expiry (Kyverno 15 days, Gatekeeper 90 days): long
  enough for a daily or weekly `certs rotate` job to miss a run or two, short enough that a 1-year certificate
  is not reissued needlessly. The CA is rolled over 90 days before expiry (Gatekeeper's window).
- A serving certificate never outlives its CA (its notAfter is clamped), and is back-dated 5 minutes for clock
  skew between the issuing machine and the API server.
"""
