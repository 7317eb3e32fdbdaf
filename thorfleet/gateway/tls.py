"""The gateway's TLS certificate, on the laptop: the operator's own, or one signed by a fleet CA.

    names = check_names(["thor-gw.lan", "10.0.0.5"])   # every name a client uses (settings.schema)
    ca = ensure_fleet_ca(ca_dir)                      # made once; the file clients trust
    cert, key = gateway_pair(ca_dir, "gw-1", names)   # kept, reissued only when it must be
    cert, key = held_pair(ca_dir, "gw-1", names)      # read only: what gateway_pair left
    pem = haproxy_pem(cert, key)                      # what HAProxy's `crt` reads

A re-run returns the same bytes, so the deploy that uploads them changes nothing. Only the
deploy's one laptop step makes files (thorfleet/plan.py, make_laptop_files); the rest reads them.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import re
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from thorfleet.run.laptop import private_dir, write_whole
from thorfleet.settings.schema import check_names, ip_address_or_none

# An inventory name becomes a file name under ca_dir/gateways: no '/', no '.' or '..' alone.
INVENTORY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
CA_YEARS = 10
# Apple's platforms refuse TLS server certificates valid longer than 825 days, private CAs included
# (Apple support HT210176, "Requirements for trusted certificates in iOS 13 and macOS 10.15").
GATEWAY_DAYS = 825
RENEW_BEFORE = datetime.timedelta(days=30)
# X.509's upper bound on a common name (RFC 5280 appendix A, ub-common-name): a longer DNS name
# lives in the SANs alone, which is where clients look (RFC 6125 section 6.4.4).
CN_MAX = 64
# Backdated so a client whose clock runs a little behind the laptop's still accepts a fresh one.
SKEW = datetime.timedelta(minutes=5)


def ensure_fleet_ca(ca_dir: Path) -> Path:
    """ca_dir/fleet-ca.pem, made once with its key (fleet-ca.key, 0600) and never replaced."""
    cert_file, key_file = ca_dir / "fleet-ca.pem", ca_dir / "fleet-ca.key"
    with _locked(ca_dir):  # two deploys at once make one CA
        if cert_file.exists():
            if not key_file.exists():  # clients trust this CA: a new one would cut them all off
                raise ValueError(f"{key_file}: missing, so the fleet CA {cert_file} cannot sign; "
                                 f"restore the key (or remove both files to start a new CA)")
            return cert_file
        # The certificate gone and its key still here: made again from the same key and name, so
        # the clients holding the lost file still trust what it signs (a new key would cut them
        # all off). A key a cut run left half-written never signed anything: it is replaced.
        key = _readable_key(key_file)
        if key is None:
            key = ec.generate_private_key(ec.SECP256R1())
            write_whole(key_file, _key_pem(key), private=True)  # key first: the cert's presence means both
        cert = _certificate("thorfleet fleet CA", key.public_key(), None, key, 365 * CA_YEARS, [
            # path_length=0: it signs gateways' certificates, never another CA
            (x509.BasicConstraints(ca=True, path_length=0), True),
            (x509.KeyUsage(digital_signature=False, content_commitment=False,
                           key_encipherment=False, data_encipherment=False, key_agreement=False,
                           key_cert_sign=True, crl_sign=True, encipher_only=False,
                           decipher_only=False), True)])
        write_whole(cert_file, cert.public_bytes(serialization.Encoding.PEM), private=True)
        return cert_file


def _readable_key(key_file: Path):
    """The key in `key_file`, or None when there is none or a cut run left it half-written."""
    try:
        return serialization.load_pem_private_key(key_file.read_bytes(), None)
    except (FileNotFoundError, ValueError, TypeError, UnsupportedAlgorithm):
        return None


def gateway_pair(ca_dir: Path, gateway: str, names: list[str]) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for inventory host `gateway`, signed by the fleet CA for `names`.
    The chain is the leaf alone: clients hold the CA itself. Kept in ca_dir/gateways/ and returned
    byte for byte until the names change, the CA changes, or it has 30 days left."""
    cert_file, key_file = _pair_files(ca_dir, gateway)
    names = check_names(names)
    ca_cert_file = ensure_fleet_ca(ca_dir)
    with _locked(ca_dir):
        ca_cert = x509.load_pem_x509_certificate(ca_cert_file.read_bytes())
        ca_key = serialization.load_pem_private_key((ca_dir / "fleet-ca.key").read_bytes(), None)
        private_dir(cert_file.parent)
        if cert_file.exists() and key_file.exists():
            cert_pem, key_pem = cert_file.read_bytes(), key_file.read_bytes()
            if _still_good(cert_pem, key_pem, ca_cert, names):
                return cert_pem, key_pem
        key = ec.generate_private_key(ec.SECP256R1())
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        # The common name is the first name that fits one; none fits: no subject, and the SANs
        # critical (RFC 5280 4.2.1.6). The leaf never outlives the CA (capped at its end).
        common = next((n for n in names if len(n) <= CN_MAX), None)
        cert = _certificate(common, key.public_key(), ca_cert.subject, ca_key, GATEWAY_DAYS, [
            (x509.SubjectAlternativeName([_general_name(n) for n in names]), common is None),
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            (x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), False)],
            until=ca_cert.not_valid_after_utc)
        cert_pem, key_pem = cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)
        # Key first: a cut between the two leaves an old cert that fails _still_good's key match.
        write_whole(key_file, key_pem, private=True)
        write_whole(cert_file, cert_pem, private=True)
        return cert_pem, key_pem


def held_pair(ca_dir: Path, gateway: str, names: list[str]) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) that gateway_pair left for `gateway` and `names`, read only: a
    ValueError naming the fix when there is none yet, or it no longer fits (another CA, other
    names, 30 days left)."""
    names = check_names(names)
    cert_file, key_file = _pair_files(ca_dir, gateway)
    fix = "a deploy makes it before it plans any host (pyinfra INVENTORY deploy.py)"
    try:
        ca_cert = x509.load_pem_x509_certificate((ca_dir / "fleet-ca.pem").read_bytes())
        cert_pem, key_pem = cert_file.read_bytes(), key_file.read_bytes()
    except FileNotFoundError as error:
        raise ValueError(f"the door's certificate: {error.filename} is not made yet: {fix}")
    if not _still_good(cert_pem, key_pem, ca_cert, names):
        raise ValueError(f"the door's certificate {cert_file} does not fit the fleet CA, the names "
                         f"{', '.join(names)} or the next 30 days: {fix}")
    return cert_pem, key_pem


def _pair_files(ca_dir: Path, gateway: str) -> tuple[Path, Path]:
    """Where gateway_pair keeps `gateway`'s certificate and key (an inventory name, checked: it
    becomes a file name)."""
    if not isinstance(gateway, str) or not INVENTORY_NAME.fullmatch(gateway):
        raise ValueError(f"gateway host {gateway!r}: an inventory name of letters, digits, '.', "
                         f"'_' or '-', starting with a letter or digit")
    folder = ca_dir / "gateways"
    return folder / f"{gateway}.pem", folder / f"{gateway}.key"


def operator_pair(cert_file: Path, key_file: Path, names: list[str]) -> tuple[bytes, bytes]:
    """The operator's certificate (chain) and key, as given, once they are known to fit together,
    to be valid now, and to name every one of `names`."""
    names = check_names(names)
    cert_pem, key_pem = Path(cert_file).read_bytes(), Path(key_file).read_bytes()
    try:
        leaf = x509.load_pem_x509_certificates(cert_pem)[0]  # the server's own comes first
    except ValueError as error:
        raise ValueError(f"gateway_tls_cert_file {cert_file}: not a PEM certificate ({error})")
    try:
        key = serialization.load_pem_private_key(key_pem, None)
    except (ValueError, TypeError) as error:  # TypeError: encrypted, and HAProxy has no password
        raise ValueError(f"gateway_tls_key_file {key_file}: not an unencrypted PEM key ({error})")
    if _public(key) != _public(leaf):
        raise ValueError(f"gateway_tls_key_file {key_file}: is not the key of the certificate "
                         f"in {cert_file}")
    now = _now()
    if leaf.not_valid_after_utc <= now:
        raise ValueError(f"gateway_tls_cert_file {cert_file}: expired on "
                         f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    if leaf.not_valid_before_utc > now:
        raise ValueError(f"gateway_tls_cert_file {cert_file}: not valid until "
                         f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    ips = {n.value for n in _san(leaf) if isinstance(n, x509.IPAddress)}
    dns = {n.value.lower() for n in _san(leaf) if isinstance(n, x509.DNSName)}

    def named(name):
        address = ip_address_or_none(name)
        return address in ips if address is not None else _dns_covered(name, dns)

    missing = [n for n in names if not named(n)]
    if missing:
        raise ValueError(f"gateway_tls_cert_file {cert_file}: its SANs do not name "
                         f"{', '.join(missing)}; clients checking the hostname would refuse it")
    return cert_pem, key_pem


def haproxy_pem(cert: bytes, key: bytes) -> bytes:
    """One file with the certificate (and chain) then the key: HAProxy's `crt` reads both from it
    (HAProxy configuration manual, bind option "crt")."""
    return b"".join(part if part.endswith(b"\n") else part + b"\n" for part in (cert, key))


def _still_good(cert_pem: bytes, key_pem: bytes, ca_cert: x509.Certificate, names) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, None)
        cert.verify_directly_issued_by(ca_cert)  # raises when another CA (or key) signed it
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False  # unreadable, or another CA's: reissue, the CA's key is at hand
    return (_public(key) == _public(cert)  # a cut between the two writes leaves a mismatch
            and set(_san(cert)) == {_general_name(n) for n in names}  # order is not a change
            and cert.not_valid_after_utc - _now() > RENEW_BEFORE)


def _certificate(common_name, public_key, issuer, signer, days: int, extensions, until=None):
    """A certificate for `public_key` signed by `signer` (self-signed when `issuer` is None), valid
    `days` from its backdated start (so its whole life is `days`, never more), and not past
    `until` when given (the issuer's own end)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name
                     else [])
    start = _now() - SKEW
    end = start + datetime.timedelta(days=days)
    builder = (
        x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
        .public_key(public_key).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(min(end, until) if until else end)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def _san(cert: x509.Certificate) -> list[x509.GeneralName]:
    try:
        return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return []


def _dns_covered(name: str, dns: set[str]) -> bool:
    # A wildcard covers exactly one leftmost label, as clients match it (RFC 6125 section 6.4.3).
    return name in dns or ("." in name and "*." + name.split(".", 1)[1] in dns)


def _general_name(name: str) -> x509.GeneralName:
    address = ip_address_or_none(name)
    return x509.IPAddress(address) if address is not None else x509.DNSName(name)


def _public(holder) -> bytes:
    return holder.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@contextlib.contextmanager
def _locked(ca_dir: Path):
    with open(private_dir(ca_dir) / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield

