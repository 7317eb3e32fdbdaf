"""The gateway: HAProxy's config and the Thors' firewall (config), the fleet CA and the gateway's
certificate (tls), and Prometheus on the gateway (monitor)."""
