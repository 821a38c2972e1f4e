#!/usr/bin/env python3
"""A fixed delay on packets, through NFQUEUE, for kernels without sch_netem.

    fleet-delay.py QUEUE_NUM DELAY_MS

Binds netfilter queue QUEUE_NUM in the caller's network namespace and accepts
every packet queued there DELAY_MS after it arrived, in arrival order (one
batch verdict per due moment, so the cost is per wake-up, not per packet). The
packets are queued by iptables rules (`-j NFQUEUE --queue-num N
--queue-bypass`) that e2e/lib/fleet-net.sh `link-slow` adds; the rate limit is
the kernel's (tbf). Only the metadata of a packet is read (copy mode META,
GSO packets kept whole). Stops on SIGTERM; the rules' --queue-bypass lets
traffic through unchanged once no process holds the queue.

Standard library only: raw netlink (nfnetlink_queue).
"""
import os
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
SO_RCVBUFFORCE = 33


def attr(kind, payload):
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * ((4 - n % 4) % 4)


def msg(kind, queue, attrs, flags=NLM_F_REQUEST):
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0, 0) + body


def config(sock, queue, attrs):
    sock.send(msg(NFQNL_MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK))
    data = sock.recv(65536)
    _, kind, _, _, _ = struct.unpack_from("=IHHII", data)
    if kind == NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, 16)
        if err:
            raise OSError(-err, os.strerror(-err))


def main():
    queue, delay = int(sys.argv[1]), float(sys.argv[2]) / 1000.0
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
    except OSError:
        pass
    config(sock, queue, [attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, 0))])
    config(sock, queue, [
        attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META)),
        attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", 65536)),
        attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_GSO)),
        attr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_GSO)),
    ])
    print(f"fleet-delay: queue {queue}, {delay * 1000:.0f} ms", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    pending = []  # (due, packet id), in arrival order
    head = 0
    while True:
        timeout = None
        if head < len(pending):
            timeout = max(0.0, pending[head][0] - time.monotonic())
        sock.settimeout(timeout)
        try:
            data = sock.recv(1 << 20)
        except socket.timeout:
            data = b""
        except OSError as e:
            # EAGAIN: a zero timeout; ENOBUFS: notifications were lost, and the next
            # batch verdict (every id up to one) lets those packets through too.
            if e.errno not in (11, 105):
                raise
            data = b""
        now = time.monotonic()
        off = 0
        while off + 16 <= len(data):
            n, kind, _, _, _ = struct.unpack_from("=IHHII", data, off)
            if n < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                a = off + 20
                while a + 4 <= off + n:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    if atype & 0x7FFF == NFQA_PACKET_HDR:
                        (pid,) = struct.unpack_from(">I", data, a + 4)
                        pending.append((now + delay, pid))
                        break
                    a += (alen + 3) & ~3
            off += (n + 3) & ~3
        last = None
        while head < len(pending) and pending[head][0] <= now:
            last = pending[head][1]
            head += 1
        if last is not None:
            sock.send(msg(NFQNL_MSG_VERDICT_BATCH, queue,
                          [attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, last))]))
        if head > 4096:
            del pending[:head]
            head = 0


if __name__ == "__main__":
    main()
