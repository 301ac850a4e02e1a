"""The encrypted overlay between a job's nodes: WireGuard, one address per node, keys made on the
node, joins authorised by short-lived tokens.

Ray, gloo and NCCL carry no encryption or authentication of their own; between locations their
traffic would cross the public internet. Every node of a job therefore joins one WireGuard network
(``100.64.0.0/10``, shared address space, never routed on the internet) and Ray and the runtime
bind to overlay addresses; between nodes only the overlay's UDP port needs to be open.

The pieces (docs/overlay.md has the design and its failure cases):

- ``wg.py``: one WireGuard interface, kernel module where present, ``wireguard-go`` otherwise;
- ``token.py``: join tokens (the controller's endpoint and key, the node's address, a one-use
  ephemeral key, an expiry);
- ``service.py``: the controller's side: mints tokens, admits joins, hands out the peer list;
- ``node.py``: a node's side: joins with its token under a key it made itself, follows the peers.
"""
