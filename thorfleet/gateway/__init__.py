"""The gateway: HAProxy's config and the Thors' firewall (config), the door's rules for sharing a
pool (policy), the fleet CA and the gateway's certificate (tls), and Prometheus on the gateway
(monitor)."""
