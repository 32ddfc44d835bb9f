#!/usr/bin/env python3
"""Writes the fake NVML board descriptions in this folder (deterministic).

Run from anywhere: python3 tests/fakes/fake_nvml/boards/make_boards.py
The boards' PCI bus ids and NUMA affinities match the fixture trees under
tests/topology/fixtures/ that use them (see each fixture's nvml-board file).
"""
import hashlib
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def uuid(seed):
    h = hashlib.sha256(seed.encode()).hexdigest()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def write(name, board):
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump(board, f, indent=2)
        f.write("\n")


def dgx_h100():
    # HGX H100 8-GPU: 4 NVSwitch chips; each GPU has 18 NVLink4 links split
    # 5/4/4/5 over the switches. GPUs 0-3 on socket 0, 4-7 on socket 1.
    gpu_buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
    switches = ["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"]
    split = [0] * 5 + [1] * 4 + [2] * 4 + [3] * 5
    gpus = []
    for i, bus in enumerate(gpu_buses):
        node = 0 if i < 4 else 1
        links = []
        for link in range(18):
            # GPU 7 link 17 trained down: present but inactive.
            active = not (i == 7 and link == 17)
            links.append({
                "link": link,
                "active": active,
                "remote_pci_bus_id": switches[split[link]] if active else "",
                "remote_type": "switch",
            })
        gpus.append({
            "uuid": uuid("dgx-h100-%d" % i),
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": "00000000:%s:00.0" % bus.upper(),
            "pci_device_id": "233010DE",
            "memory_total_bytes": 85520809984,
            "memory_free_bytes": 84987740160,
            "memory_affinity": [node],
            "cpu_affinity": "0-55,112-167" if node == 0 else "56-111,168-223",
            "numa_node_id": None,
            "nvlinks": links,
        })
    write("dgx-h100-8gpu-nvswitch", {
        "description": "HGX H100 8-GPU board, 4 NVSwitches, 2 sockets (nodes 0 and 1)",
        "gpus": gpus,
    })


def two_gpu_bridge():
    # Two H100 NVL cards joined by NVLink bridges (12 links each, all to the
    # peer). One card per socket, matching tests/topology/fixtures/two-socket-cxl.
    cards = [("00000000:17:00.0", 0, "0-7,16-23"), ("00000000:CA:00.0", 1, "8-15,24-31")]
    gpus = []
    for i, (bus, node, cpus) in enumerate(cards):
        peer = cards[1 - i][0]
        gpus.append({
            "uuid": uuid("2gpu-nvlink-bridge-%d" % i),
            "name": "NVIDIA H100 NVL",
            "pci_bus_id": bus,
            "pci_device_id": "232110DE",
            "memory_total_bytes": 100485038080,
            "memory_free_bytes": 99943972864,
            "memory_affinity": [node],
            "cpu_affinity": cpus,
            "numa_node_id": None,
            "nvlinks": [{"link": l, "active": True, "remote_pci_bus_id": peer,
                         "remote_type": "gpu"} for l in range(12)],
        })
    write("2gpu-nvlink-bridge", {
        "description": "2 PCIe GPUs linked to each other by NVLink bridges, one per socket",
        "gpus": gpus,
    })


def grace_hopper():
    # GH200: the GPU's HBM is NUMA node 1 (CPU-less); Grace CPUs and LPDDR
    # are node 0. C2C is not an NVLink that NVML lists, so no links.
    write("grace-hopper", {
        "description": "Grace Hopper superchip: 1 GPU whose memory is NUMA node 1",
        "gpus": [{
            "uuid": uuid("grace-hopper-0"),
            "name": "NVIDIA GH200 480GB",
            "pci_bus_id": "00000009:01:00.0",
            "pci_device_id": "234210DE",
            "memory_total_bytes": 102005473280,
            "memory_free_bytes": 101468602368,
            "memory_affinity": [0],
            "cpu_affinity": "0-71",
            "numa_node_id": 1,
            "nvlinks": [],
        }],
    })


if __name__ == "__main__":
    dgx_h100()
    two_gpu_bridge()
    grace_hopper()
