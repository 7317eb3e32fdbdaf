"""thorfleet doctor's probe of a gateway's package mirror, run by python3 on the box with the
mirror's URL (the first http(s) one of APT's sources): one JSON line, whether it answers within
5 s. Any HTTP answer counts as reachable; read only."""

import json
import sys
import urllib.error
import urllib.request

url = sys.argv[1]
try:
    with urllib.request.urlopen(url, timeout=5) as answer:
        print(json.dumps({"url": url, "ok": True, "said": f"HTTP {answer.status}"}))
except urllib.error.HTTPError as error:  # it answered: reachable
    print(json.dumps({"url": url, "ok": True, "said": f"HTTP {error.code}"}))
except Exception as error:  # noqa: BLE001 - the row says what failed
    print(json.dumps({"url": url, "ok": False, "said": str(error)[:200]}))
