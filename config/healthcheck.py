"""The image's HEALTHCHECK: GET /api/health/ready on the main listener (127.0.0.1:$MODELGATE_PORT).

With server.tls on, set MODELGATE_TLS_CERT to the same file as server.tls.cert_file: the check then
speaks HTTPS and trusts exactly the certificate modelgate presents (the file's first certificate is
the one trust anchor; the name is not checked, as 127.0.0.1 is rarely in a public certificate).
Certificate verification stays on.
"""
import os
import ssl
import sys
import urllib.request

port = os.environ.get("MODELGATE_PORT", "3000")
cert_file = os.environ.get("MODELGATE_TLS_CERT")
context = None
if cert_file:
    end = "-----END CERTIFICATE-----"
    with open(cert_file) as f:
        leaf = f.read().split(end)[0] + end + "\n"
    context = ssl.create_default_context(cadata=leaf)
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
scheme = "https" if cert_file else "http"
try:
    urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/api/health/ready", timeout=4, context=context)
except Exception as err:  # noqa: BLE001 - any failure is unhealthy
    print(f"modelgate not ready: {err}", file=sys.stderr)
    sys.exit(1)
