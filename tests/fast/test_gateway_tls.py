"""The gateway's certificate on the laptop: a fleet CA made once, a gateway certificate kept byte
for byte until it must change, the operator's own checked, and a real TLS handshake that verifies the
hostname against the fleet CA the way a client does."""

import datetime
import ipaddress
import re
import socket
import ssl
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from thorfleet.gateway import tls
from thorfleet.gateway.tls import ensure_fleet_ca, gateway_pair, haproxy_pem, operator_pair
from thorfleet.settings.schema import check_names

NAMES = ["thor-gw.lan", "10.0.0.5"]


@pytest.mark.parametrize(("given", "written"), [
    ("thor-1.lan", "thor-1.lan"), ("10.0.0.1", "10.0.0.1"), ("::1", "::1"),
    ("localhost", "localhost"), ("Thor-GW.LAN", "thor-gw.lan"), ("0:0::1", "::1"),
    ("a" * 63 + ".lan", "a" * 63 + ".lan"), ("x1.y2.internal", "x1.y2.internal"),
])
def test_good_names_are_kept_in_one_spelling(given, written):
    assert check_names([given]) == [written]


@pytest.mark.parametrize("bad", [
    "a b", "x\n", "-a", "a-", "*.x", "x.", ".x", "a..b", "", "a" * 64 + ".lan",
    ".".join(["a" * 63] * 4) + ".ab", "thor_gw", "10.1", "10.0.0.01", "fe80::1%eth0",
    "thör.lan", "10.0.0.1\n", "a/b", 5, None,
])
def test_bad_names_are_refused_naming_the_value_and_the_rule(bad):
    with pytest.raises(ValueError, match="RFC 1123") as refused:
        check_names(["ok.lan", bad])
    assert repr(bad) in str(refused.value)


def test_names_deduplicated_in_order_and_none_refused():
    assert check_names(["b.lan", "10.0.0.1", "B.lan", "a.lan", "10.0.0.1"]) == [
        "b.lan", "10.0.0.1", "a.lan"]
    with pytest.raises(ValueError, match="none given"):
        check_names([])


def test_fleet_ca_made_once_with_its_key_kept_private(tmp_path):
    ca_dir = tmp_path / "ca"
    cert_file = ensure_fleet_ca(ca_dir)
    first, stamp = cert_file.read_bytes(), cert_file.stat().st_mtime_ns
    key = (ca_dir / "fleet-ca.key").read_bytes()
    assert ensure_fleet_ca(ca_dir) == cert_file
    assert (cert_file.read_bytes(), cert_file.stat().st_mtime_ns) == (first, stamp)
    assert (ca_dir / "fleet-ca.key").read_bytes() == key
    assert (ca_dir / "fleet-ca.key").stat().st_mode & 0o777 == 0o600
    assert ca_dir.stat().st_mode & 0o777 == 0o700
    ca = x509.load_pem_x509_certificate(first)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "thorfleet fleet CA"


def test_two_deploys_at_once_make_one_ca(tmp_path, monkeypatch):
    made, generate = [], ec.generate_private_key

    def slow_generate(curve):  # widens the window two unlocked deploys would both fall into
        made.append(curve)
        threading.Event().wait(0.1)
        return generate(curve)

    monkeypatch.setattr(tls.ec, "generate_private_key", slow_generate)
    start, returned = threading.Barrier(4), []
    runs = [threading.Thread(target=lambda: (start.wait(),
                                             returned.append(ensure_fleet_ca(tmp_path / "ca"))))
            for _ in range(4)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert len(made) == 1
    assert returned == [tmp_path / "ca" / "fleet-ca.pem"] * 4  # none of them failed
    key = serialization.load_pem_private_key((tmp_path / "ca" / "fleet-ca.key").read_bytes(), None)
    cert = x509.load_pem_x509_certificate(returned[0].read_bytes())
    assert cert.public_key() == key.public_key()


def test_a_ca_whose_key_is_gone_is_refused_not_replaced(tmp_path):
    cert_file = ensure_fleet_ca(tmp_path)
    trusted = cert_file.read_bytes()
    (tmp_path / "fleet-ca.key").unlink()
    with pytest.raises(ValueError, match="fleet-ca.key: missing"):
        ensure_fleet_ca(tmp_path)
    assert cert_file.read_bytes() == trusted


def test_gateway_pair_signed_by_the_ca_and_byte_identical_on_a_rerun(tmp_path):
    cert_pem, key_pem = gateway_pair(tmp_path, "gw-1", NAMES)
    assert gateway_pair(tmp_path, "gw-1", NAMES) == (cert_pem, key_pem)
    for suffix in ("pem", "key"):
        assert (tmp_path / "gateways" / f"gw-1.{suffix}").stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(
        (tmp_path / "fleet-ca.pem").read_bytes()))
    assert sans(cert_pem) == {x509.DNSName("thor-gw.lan"),
                              x509.IPAddress(ipaddress.ip_address("10.0.0.5"))}
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "thor-gw.lan"
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == \
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
    cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    # 825 days from its backdated start, not 825 days and the 5 minutes (Apple's limit is the whole)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=825)


def test_a_changed_name_set_reissues_and_a_reordered_one_does_not(tmp_path):
    first = gateway_pair(tmp_path, "gw-1", NAMES)
    assert gateway_pair(tmp_path, "gw-1", NAMES[::-1]) == first
    grown = gateway_pair(tmp_path, "gw-1", [*NAMES, "gw.example"])
    assert grown[0] != first[0] and grown[1] != first[1]
    assert x509.DNSName("gw.example") in sans(grown[0])


def test_a_key_that_no_longer_fits_its_certificate_reissues(tmp_path):
    # what a run cut between writing the new key and the new certificate leaves behind
    first = gateway_pair(tmp_path, "gw-1", NAMES)
    (tmp_path / "gateways" / "gw-1.key").write_bytes(gateway_pair(tmp_path, "gw-2", NAMES)[1])
    second = gateway_pair(tmp_path, "gw-1", NAMES)
    assert second[0] != first[0]
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    (tmp_path / "gw-1.pem").write_bytes(haproxy_pem(*second))
    server.load_cert_chain(tmp_path / "gw-1.pem")  # raises when key and certificate differ


def test_a_ca_key_left_without_its_certificate_is_replaced(tmp_path):
    # a run cut after writing the key: no client trusts a CA whose certificate was never written
    (tmp_path / "fleet-ca.key").write_bytes(b"half a key")
    ensure_fleet_ca(tmp_path)
    serialization.load_pem_private_key((tmp_path / "fleet-ca.key").read_bytes(), None)


def test_a_lost_ca_certificate_is_made_again_from_its_key_and_clients_keep_trusting(tmp_path):
    """Clients hold the lost fleet-ca.pem: the one made again has the same key and name, so what
    it signs from now on verifies against their copy (a new key would cut them all off)."""
    cert_file = ensure_fleet_ca(tmp_path)
    held_by_clients = x509.load_pem_x509_certificate(cert_file.read_bytes())
    key = (tmp_path / "fleet-ca.key").read_bytes()
    cert_file.unlink()
    ensure_fleet_ca(tmp_path)
    assert (tmp_path / "fleet-ca.key").read_bytes() == key
    leaf = x509.load_pem_x509_certificate(gateway_pair(tmp_path, "gw-1", NAMES)[0])
    leaf.verify_directly_issued_by(held_by_clients)


def test_a_name_too_long_for_a_common_name_lives_in_the_sans(tmp_path):
    """X.509 caps a common name at 64 characters; DNS names run to 253."""
    long_name = ".".join(["a" * 40, "b" * 40, "lan"])
    cert = x509.load_pem_x509_certificate(gateway_pair(tmp_path, "gw-1", [long_name, "10.0.0.5"])[0])
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "10.0.0.5"
    assert x509.DNSName(long_name) in sans(cert.public_bytes(serialization.Encoding.PEM))
    alone = x509.load_pem_x509_certificate(gateway_pair(tmp_path, "gw-2", [long_name])[0])
    assert alone.subject == x509.Name([])
    assert alone.extensions.get_extension_for_class(x509.SubjectAlternativeName).critical


def test_the_gateway_certificate_never_outlives_the_ca(tmp_path, monkeypatch):
    ca = x509.load_pem_x509_certificate(ensure_fleet_ca(tmp_path).read_bytes())
    late = ca.not_valid_after_utc - datetime.timedelta(days=100)
    monkeypatch.setattr(tls, "_now", lambda: late)
    leaf = x509.load_pem_x509_certificate(gateway_pair(tmp_path, "gw-1", NAMES)[0])
    assert leaf.not_valid_after_utc == ca.not_valid_after_utc


def test_a_new_ca_reissues(tmp_path):
    first = gateway_pair(tmp_path, "gw-1", NAMES)
    (tmp_path / "fleet-ca.pem").unlink()
    (tmp_path / "fleet-ca.key").unlink()
    second = gateway_pair(tmp_path, "gw-1", NAMES)
    assert second[0] != first[0]
    x509.load_pem_x509_certificate(second[0]).verify_directly_issued_by(
        x509.load_pem_x509_certificate((tmp_path / "fleet-ca.pem").read_bytes()))


def test_a_certificate_with_30_days_left_is_reissued(tmp_path, monkeypatch):
    first = gateway_pair(tmp_path, "gw-1", NAMES)
    later = tls._now() + datetime.timedelta(days=825 - 29)
    monkeypatch.setattr(tls, "_now", lambda: later)
    assert gateway_pair(tmp_path, "gw-1", NAMES)[0] != first[0]


@pytest.mark.parametrize("bad", ["../gw", "gw/1", "gw\n", "", ".", "-gw"])
def test_the_gateway_host_name_is_checked_before_it_names_a_file(tmp_path, bad):
    with pytest.raises(ValueError, match="inventory name"):
        gateway_pair(tmp_path, bad, NAMES)


def test_the_operators_pair_is_returned_as_given(tmp_path):
    cert_file, key_file = operator_files(tmp_path, ["*.lan", "10.0.0.5"])
    assert operator_pair(cert_file, key_file, NAMES) == (cert_file.read_bytes(),
                                                         key_file.read_bytes())


def test_the_operators_key_must_be_the_certificates(tmp_path):
    cert_file, _ = operator_files(tmp_path, NAMES)
    _, other_key = operator_files(tmp_path / "other", NAMES)
    with pytest.raises(ValueError, match=f"{re.escape(str(other_key))}: is not the key of the"):
        operator_pair(cert_file, other_key, NAMES)


def test_the_operators_certificate_must_name_every_name(tmp_path):
    cert_file, key_file = operator_files(tmp_path, ["thor-gw.lan"])
    with pytest.raises(ValueError,
                       match=f"{re.escape(str(cert_file))}: its SANs do not name 10.0.0.5, gw.lan"):
        operator_pair(cert_file, key_file, [*NAMES, "gw.lan"])


def test_an_expired_operator_certificate_is_refused(tmp_path):
    cert_file, key_file = operator_files(tmp_path, NAMES, days=-1)
    with pytest.raises(ValueError, match=f"{re.escape(str(cert_file))}: expired on"):
        operator_pair(cert_file, key_file, NAMES)


def test_a_client_verifies_the_gateway_by_hostname_against_the_fleet_ca(tmp_path):
    combined = tmp_path / "gateway.pem"  # HAProxy's crt file, which Python's ssl reads as well
    combined.write_bytes(haproxy_pem(*gateway_pair(tmp_path, "gw-1", ["127.0.0.1", "localhost"])))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(combined)
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener, server), daemon=True).start()
    client = ssl.create_default_context(cafile=str(tmp_path / "fleet-ca.pem"))
    client.verify_flags |= ssl.VERIFY_X509_STRICT  # what Python 3.13's default context sets
    assert client.check_hostname
    try:
        for name in ("localhost", "127.0.0.1"):
            with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                    client.wrap_socket(raw, server_hostname=name) as tls:
                assert tls.recv(2) == b"ok"
        with pytest.raises(ssl.SSLCertVerificationError, match="thor-gw.example"), \
                socket.create_connection(listener.getsockname(), timeout=10) as raw:
            client.wrap_socket(raw, server_hostname="thor-gw.example")
    finally:
        listener.close()


def serve(listener, context):
    while True:
        try:
            raw, _ = listener.accept()
        except OSError:  # the test closed the listener
            return
        try:
            with context.wrap_socket(raw, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):  # the client refused the certificate
            pass


def sans(cert_pem):
    cert = x509.load_pem_x509_certificate(cert_pem)
    return set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)


def operator_files(folder, names, days=90):
    """A self-signed certificate for `names` and its key, as an operator would bring them."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.timezone.utc)
    general = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n)
               for n in names]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=100))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(general), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "gw.crt", folder / "gw.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file
