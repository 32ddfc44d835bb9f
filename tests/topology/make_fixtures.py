#!/usr/bin/env python3
"""Builds the topology fixture trees: tests/topology/fixtures/<name>/root/.

Each root/ is a sysfs/procfs tree laid out like the kernel's (relative
symlinks included), readable both by cxlpool (CXLPOOL_FSROOT / --sysfs-root)
and by hwloc (HWLOC_FSROOT). The synthetic trees are rebuilt
deterministically from this script; running it twice gives identical trees.
Only root/ is rewritten: expected.json beside it is left alone.

  make_fixtures.py                 rebuild every synthetic tree
  make_fixtures.py --out DIR       write the trees under DIR instead
  make_fixtures.py two-socket-cxl  rebuild only the named trees
  make_fixtures.py --capture-this-machine
                                   recapture 'this-machine' from the real
                                   machine (hwloc-gather-topology plus the
                                   files cxlpool reads that it does not take)
"""
import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BLOCK = 2 * GiB  # memory block size used by the synthetic trees
PAGE = 4096


# ---- tree writer -------------------------------------------------------------

class Tree:
    """Writes machine paths ("/sys/...") under a root directory."""

    def __init__(self, root):
        self.root = root

    def host(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def file(self, path, content):
        p = self.host(path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if isinstance(content, str):
            if content and not content.endswith("\n"):
                content += "\n"
            content = content.encode()
        with open(p, "wb") as f:
            f.write(content)

    def link(self, path, target):
        """A symlink at machine path `path` to machine path `target`,
        stored relative (as sysfs does) so it never leaves the root."""
        p = self.host(path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        rel = os.path.relpath(target, os.path.dirname(path))
        if os.path.islink(p) and os.readlink(p) == rel:
            return  # shared parent (e.g. one port, two endpoints)
        os.symlink(rel, p)


def fmt_list(ids):
    """[0,1,2,3,8] -> "0-3,8" (Linux list format)."""
    ids = sorted(ids)
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else "%d-%d" % (ids[i], ids[j]))
        i = j + 1
    return ",".join(out)


def fmt_mask(ids, nbits):
    """Linux cpumask: 32-bit hex words, most significant first."""
    words = []
    for w in range((max(nbits, 1) + 31) // 32 - 1, -1, -1):
        v = sum(1 << (c - 32 * w) for c in ids if 32 * w <= c < 32 * (w + 1))
        words.append("%08x" % v)
    return ",".join(words)


# ---- CPUs --------------------------------------------------------------------

def add_cpus(t, cpus, arch="x86"):
    """cpus: list of (cpu, package, core, node)."""
    n = max(c[0] for c in cpus) + 1
    ids = [c[0] for c in cpus]
    base = "/sys/devices/system/cpu"
    for key in ("online", "possible", "present"):
        t.file("%s/%s" % (base, key), fmt_list(ids))
    t.file(base + "/offline", "")
    t.file(base + "/kernel_max", "8191")
    for cpu, pkg, core, node in cpus:
        d = "%s/cpu%d" % (base, cpu)
        sibs = [c[0] for c in cpus if c[1] == pkg and c[2] == core]
        pkgs = [c[0] for c in cpus if c[1] == pkg]
        topo = d + "/topology"
        t.file(topo + "/physical_package_id", str(pkg))
        t.file(topo + "/core_id", str(core))
        t.file(topo + "/die_id", "0")
        for name, members in (("core_cpus", sibs), ("thread_siblings", sibs),
                              ("package_cpus", pkgs), ("core_siblings", pkgs),
                              ("die_cpus", pkgs)):
            t.file("%s/%s" % (topo, name), fmt_mask(members, n))
            t.file("%s/%s_list" % (topo, name), fmt_list(members))
        t.file(d + "/online", "1")
        t.link("%s/node%d" % (d, node), "/sys/devices/system/node/node%d" % node)
        t.link("/sys/bus/cpu/devices/cpu%d" % cpu, d)
    info = []
    for cpu, pkg, core, node in cpus:
        if arch == "x86":
            info.append("processor\t: %d\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
                        "model\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                        "physical id\t: %d\nsiblings\t: %d\ncore id\t\t: %d\n"
                        "cpu cores\t: %d\nflags\t\t: fpu sse2 avx512f\n"
                        % (cpu, pkg, len([c for c in cpus if c[1] == pkg]), core,
                           len({c[2] for c in cpus if c[1] == pkg})))
        else:
            info.append("processor\t: %d\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd sve2\n"
                        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
                        "CPU part\t: 0xd4f\nCPU revision\t: 0\n" % cpu)
    t.file("/proc/cpuinfo", "\n".join(info))


# ---- NUMA nodes, memory blocks, zoneinfo, HMAT, tiers ---------------------------

class Node:
    def __init__(self, nid, cpus=(), total_kb=0, free_kb=0, distance=None,
                 hugepages=None, blocks=(), access=None):
        self.id = nid
        self.cpus = list(cpus)
        self.total_kb = total_kb
        self.free_kb = free_kb
        self.distance = distance          # list of ints, or raw str/bytes, or None
        self.hugepages = hugepages or {}  # {size_kb: (nr, free)}
        self.blocks = list(blocks)        # [(zone, count)] of online blocks
        self.access = access or {}        # {class: dict(init=[..], rb, wb, rl, wl)}


def node_meminfo(n):
    used = n.total_kb - n.free_kb
    rows = [("MemTotal", n.total_kb), ("MemFree", n.free_kb), ("MemUsed", used),
            ("SwapCached", 0), ("Active", used // 2), ("Inactive", used // 4),
            ("Dirty", 0), ("FilePages", used // 4), ("Mapped", used // 16),
            ("AnonPages", used // 2), ("Shmem", 0), ("KernelStack", 0), ("PageTables", 0),
            ("Slab", used // 32)]
    text = "".join("Node %d %-15s %8d kB\n" % (n.id, k + ":", v) for k, v in rows)
    hp = n.hugepages.get(2048, (0, 0))
    text += "Node %d HugePages_Total: %5d\nNode %d HugePages_Free:  %5d\n" \
            "Node %d HugePages_Surp:  %5d\n" % (n.id, hp[0], n.id, hp[1], n.id, 0)
    return text


def add_nodes(t, nodes, first_block=0, zoneinfo=True, memory_blocks=True,
              block_size=BLOCK):
    base = "/sys/devices/system/node"
    ids = [n.id for n in nodes]
    ncpu = max([c for n in nodes for c in n.cpus] + [0]) + 1
    t.file(base + "/online", fmt_list(ids))
    t.file(base + "/possible", fmt_list(ids))
    t.file(base + "/has_cpu", fmt_list([n.id for n in nodes if n.cpus]))
    t.file(base + "/has_memory", fmt_list([n.id for n in nodes if n.total_kb]))
    t.file(base + "/has_normal_memory",
           fmt_list([n.id for n in nodes if any(z == "Normal" for z, _ in n.blocks)]))
    block = first_block
    if memory_blocks:
        t.file("/sys/devices/system/memory/block_size_bytes", "%x" % block_size)
        t.file("/sys/devices/system/memory/auto_online_blocks", "online")
    zones = []
    for n in nodes:
        d = "%s/node%d" % (base, n.id)
        t.link("/sys/bus/node/devices/node%d" % n.id, d)
        t.file(d + "/cpulist", fmt_list(n.cpus))
        t.file(d + "/cpumap", fmt_mask(n.cpus, ncpu))
        if n.total_kb is not None:
            t.file(d + "/meminfo", node_meminfo(n))
        if isinstance(n.distance, list):
            t.file(d + "/distance", " ".join(str(v) for v in n.distance))
        elif n.distance is not None:
            t.file(d + "/distance", n.distance)
        for cpu in n.cpus:
            t.link("%s/cpu%d" % (d, cpu), "/sys/devices/system/cpu/cpu%d" % cpu)
        for size_kb, (nr, free) in sorted(n.hugepages.items()):
            h = "%s/hugepages/hugepages-%dkB" % (d, size_kb)
            t.file(h + "/nr_hugepages", str(nr))
            t.file(h + "/free_hugepages", str(free))
            t.file(h + "/surplus_hugepages", "0")
        for cls, a in sorted(n.access.items()):
            acc = "%s/access%d" % (d, cls)
            for i in a["init"]:
                t.link("%s/initiators/node%d" % (acc, i), "%s/node%d" % (base, i))
                t.link("%s/node%d/access%d/targets/node%d" % (base, i, cls, n.id), d)
            for key, name in (("rb", "read_bandwidth"), ("wb", "write_bandwidth"),
                              ("rl", "read_latency"), ("wl", "write_latency")):
                if key in a:
                    t.file("%s/initiators/%s" % (acc, name), str(a[key]))
        pages = {}
        for zone, count in n.blocks:
            pages[zone] = pages.get(zone, 0) + count * block_size // PAGE
            if not memory_blocks:
                continue
            for _ in range(count):
                m = "/sys/devices/system/memory/memory%d" % block
                t.file(m + "/state", "online")
                t.file(m + "/valid_zones", zone)
                t.file(m + "/phys_index", "%08x" % block)
                t.link("%s/node%d" % (m, n.id), d)
                t.link("%s/memory%d" % (d, block), m)
                block += 1
        zones.append((n.id, pages))
    if zoneinfo:
        text = ""
        for nid, pages in zones:
            for zone in ("DMA", "DMA32", "Normal", "Movable", "Device"):
                if zone in ("DMA", "DMA32") and zone not in pages:
                    continue
                p = pages.get(zone, 0)
                text += ("Node %d, zone %8s\n  pages free     %d\n        min      %d\n"
                         "        spanned  %d\n        present  %d\n        managed  %d\n"
                         % (nid, zone, p // 2, p // 1000, p, p, p - p // 100))
        t.file("/proc/zoneinfo", text)
    total = sum(n.total_kb or 0 for n in nodes)
    free = sum(n.free_kb or 0 for n in nodes)
    t.file("/proc/meminfo", "MemTotal:       %d kB\nMemFree:        %d kB\n"
           "MemAvailable:   %d kB\nHugePages_Total:       0\nHugePages_Free:        0\n"
           "Hugepagesize:       2048 kB\n" % (total, free, free))


def add_tiers(t, tiers):
    for tid, nodes in tiers:
        t.file("/sys/devices/virtual/memory_tiering/memory_tier%d/nodelist" % tid,
               fmt_list(nodes))


def add_pci(t, parent, bdf, vendor, device, cls, numa, extra=None):
    d = "%s/%s" % (parent, bdf)
    t.file(d + "/vendor", "0x%04x" % vendor)
    t.file(d + "/device", "0x%04x" % device)
    t.file(d + "/class", "0x%06x" % cls)
    t.file(d + "/numa_node", str(numa))
    for k, v in (extra or {}).items():
        t.file("%s/%s" % (d, k), v)
    t.link("/sys/bus/pci/devices/" + bdf, d)
    return d


def add_common(t, kernel="6.8.0-cxlpool-fixture"):
    t.file("/proc/version", "Linux version %s (fixture) #1 SMP" % kernel)
    t.file("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro")
    for drv in ("kmem", "device_dax"):
        t.file("/sys/bus/dax/drivers/%s/uevent" % drv, "DRIVER=%s" % drv)


# ---- DAX and CXL -----------------------------------------------------------------

def add_dax(t, path, name, size, target_node, driver, align=2 * MiB, region=None):
    """A device-dax at `path` (its parent carries the dax_region group when
    `region` = dict(id, size, align, dynamic))."""
    t.file(path + "/size", str(size))
    t.file(path + "/target_node", str(target_node))
    t.file(path + "/numa_node", str(target_node))
    t.file(path + "/align", str(align))
    t.file(path + "/modalias", "dax:t0")
    if driver:
        t.link(path + "/driver", "/sys/bus/dax/drivers/" + driver)
    t.link(path + "/subsystem", "/sys/bus/dax")
    t.link("/sys/bus/dax/devices/" + name, path)
    if region:
        r = os.path.dirname(path) + "/dax_region"
        t.file(r + "/id", str(region["id"]))
        t.file(r + "/size", str(region["size"]))
        t.file(r + "/align", str(region.get("align", 2 * MiB)))
        if region["dynamic"]:
            t.file(r + "/available_size", "0")
            t.file(r + "/create", "")
            t.file(r + "/seed", "")
            t.file(r + "/delete", "")


CXL_ROOT = "/sys/devices/platform/ACPI0017:00/root0"


def cxl_link(t, name, path):
    t.link("/sys/bus/cxl/devices/" + name, path)


def add_cxl_root(t, decoders):
    """decoders: list of (name, start, size, cap)."""
    t.file(CXL_ROOT + "/devtype", "cxl_port")
    cxl_link(t, "root0", CXL_ROOT)
    for name, start, size, cap in decoders:
        d = "%s/%s" % (CXL_ROOT, name)
        t.file(d + "/devtype", "cxl_decoder_root")
        t.file(d + "/start", "0x%x" % start)
        t.file(d + "/size", "0x%x" % size)
        t.file(d + "/cap_ram", "1" if cap == "ram" else "0")
        t.file(d + "/cap_pmem", "1" if cap == "pmem" else "0")
        t.file(d + "/interleave_ways", "1")
        t.file(d + "/target_list", "0")
        cxl_link(t, name, d)


def add_memdev(t, pci_parent, bdf, mem, serial, ram, pmem, numa, port, endpoint, decoder,
               dpa_mode, dpa_size):
    """A type-3 memdev on PCI, its host-bridge port, endpoint port and
    endpoint decoder (CXL_ROOT/portP/endpointE/decoderE.0)."""
    pdev = add_pci(t, pci_parent, bdf, 0x8086, 0x0d93, 0x050210, numa)
    md = pdev + "/" + mem
    t.file(md + "/devtype", "cxl_memdev")
    t.file(md + "/serial", "0x%x" % serial)
    t.file(md + "/numa_node", str(numa))
    t.file(md + "/ram/size", "0x%x" % ram)
    t.file(md + "/pmem/size", "0x%x" % pmem)
    t.file(md + "/firmware_version", "FIXTURE FW 1.0")
    t.file(md + "/label_storage_size", "0")
    cxl_link(t, mem, md)
    pd = "%s/port%d" % (CXL_ROOT, port)
    t.file(pd + "/devtype", "cxl_port")
    t.link(pd + "/uport", "/".join(pci_parent.split("/")[:4]))  # the host bridge
    cxl_link(t, "port%d" % port, pd)
    ep = "%s/endpoint%d" % (pd, endpoint)
    t.file(ep + "/devtype", "cxl_port")
    t.link(ep + "/uport", md)
    cxl_link(t, "endpoint%d" % endpoint, ep)
    dec = "%s/%s" % (ep, decoder)
    t.file(dec + "/devtype", "cxl_decoder_endpoint")
    t.file(dec + "/mode", dpa_mode)
    t.file(dec + "/dpa_resource", "0x0")
    t.file(dec + "/dpa_size", "0x%x" % dpa_size)
    cxl_link(t, decoder, dec)


def add_region(t, root_decoder, name, size, start, mode, targets):
    r = "%s/%s/%s" % (CXL_ROOT, root_decoder, name)
    t.file(r + "/devtype", "cxl_region")
    t.file(r + "/uuid", "" if mode == "ram" else "6b1a8a6c-8f1e-4f5e-9c2d-0a1b2c3d4e5f")
    t.file(r + "/size", "0x%x" % size)
    t.file(r + "/resource", "0x%x" % start)
    t.file(r + "/mode", mode)
    t.file(r + "/interleave_ways", str(len(targets)))
    t.file(r + "/interleave_granularity", "256")
    t.file(r + "/commit", "1")
    for i, dec in enumerate(targets):
        t.file("%s/target%d" % (r, i), dec)
    cxl_link(t, name, r)
    return r


def add_cxl_ram_node(t, window, serial, node):
    """A 16 GiB CXL RAM expander onlined as system RAM into `node`: root
    decoder window (`window` bytes at 256 GiB), mem0 on PCI 0000:36:00.0,
    region0 <- mem0, dax_region0/dax0.0 bound to kmem."""
    add_cxl_root(t, [("decoder0.0", 0x4000000000, window, "ram")])
    add_memdev(t, "/sys/devices/pci0000:35/0000:35:01.0", "0000:36:00.0", "mem0",
               serial, 16 * GiB, 0, 0, port=1, endpoint=2, decoder="decoder2.0",
               dpa_mode="ram", dpa_size=16 * GiB)
    r = add_region(t, "decoder0.0", "region0", 16 * GiB, 0x4000000000, "ram", ["decoder2.0"])
    t.file(r + "/dax_region0/devtype", "cxl_dax_region")
    cxl_link(t, "dax_region0", r + "/dax_region0")
    add_dax(t, r + "/dax_region0/dax0.0", "dax0.0", 16 * GiB, node, "kmem",
            region=dict(id=0, size=16 * GiB, dynamic=True))


# ---- the trees -----------------------------------------------------------------

def two_socket_cxl(t):
    add_common(t)
    cpus = []
    for pkg in (0, 1):
        for core in range(8):
            for thread in (0, 1):
                cpus.append((pkg * 8 + core + thread * 16, pkg, core, pkg))
    cpus.sort()
    add_cpus(t, cpus)
    dram = dict(rb=262144, wb=262144, rl=110, wl=110)
    cxl = dict(rb=65536, wb=49152, rl=270, wl=290)
    nodes = [
        Node(0, [c[0] for c in cpus if c[3] == 0], 33247232, 30146560, [10, 21, 24],
             {2048: (512, 500), 1048576: (4, 4)}, [("DMA32", 2), ("Normal", 14)],
             {0: dict(init=[0], **dram), 1: dict(init=[0], **dram)}),
        Node(1, [c[0] for c in cpus if c[3] == 1], 33554432, 32505856, [21, 10, 28],
             {2048: (512, 512), 1048576: (0, 0)}, [("Normal", 16)],
             {0: dict(init=[1], **dram), 1: dict(init=[1], **dram)}),
        Node(2, [], 16777216, 16252928, [24, 28, 10],
             {2048: (0, 0), 1048576: (0, 0)}, [("Movable", 8)],
             {0: dict(init=[0], **cxl), 1: dict(init=[0], **cxl)}),
    ]
    add_nodes(t, nodes)
    add_tiers(t, [(4, [0, 1]), (22, [2])])
    # CXL: root decoder window at 256 GiB, region0 (RAM, 16 GiB) <- mem0.
    add_cxl_ram_node(t, 0x1000000000, 0x4D2, 2)
    # GPUs, one per socket, and a NIC the GPU scan must skip.
    add_pci(t, "/sys/devices/pci0000:15/0000:15:01.0", "0000:17:00.0", 0x10de, 0x2330,
            0x030200, 0, {"local_cpulist": fmt_list(nodes[0].cpus)})
    add_pci(t, "/sys/devices/pci0000:c8/0000:c8:01.0", "0000:ca:00.0", 0x10de, 0x2330,
            0x030200, 1, {"local_cpulist": fmt_list(nodes[1].cpus)})
    add_pci(t, "/sys/devices/pci0000:15/0000:15:02.0", "0000:18:00.0", 0x15b3, 0x1021,
            0x020000, 0)


def cxl_devdax(t):
    add_common(t)
    cpus = [(core + thread * 4, 0, core, 0) for thread in (0, 1) for core in range(4)]
    cpus.sort()
    add_cpus(t, cpus)
    nodes = [
        Node(0, [c[0] for c in cpus], 16515072, 15204352, [10, 17],
             {2048: (0, 0), 1048576: (0, 0)}, [("DMA32", 1), ("Normal", 7)]),
        Node(2, [], 8388608, 8126464, [17, 10], {2048: (0, 0), 1048576: (0, 0)},
             [("Normal", 4)]),
    ]
    add_nodes(t, nodes)
    add_tiers(t, [(4, [0]), (20, [2])])
    add_cxl_root(t, [("decoder0.0", 0x5000000000, 0x800000000, "ram"),
                     ("decoder0.1", 0x6000000000, 0x800000000, "pmem")])
    bridge = "/sys/devices/pci0000:0c/0000:0c:00.0"
    add_memdev(t, bridge, "0000:0d:00.0", "mem0", 0x1001, 8 * GiB, 0, 0, port=1,
               endpoint=3, decoder="decoder3.0", dpa_mode="ram", dpa_size=8 * GiB)
    add_memdev(t, "/sys/devices/pci0000:0c/0000:0c:01.0", "0000:0e:00.0", "mem1", 0x1002,
               0, 16 * GiB, 0, port=1, endpoint=4, decoder="decoder4.0", dpa_mode="pmem",
               dpa_size=16 * GiB)
    # region0: RAM region left in devdax mode (device_dax); its target node 1
    # never came online, so no node holds this memory.
    r0 = add_region(t, "decoder0.0", "region0", 8 * GiB, 0x5000000000, "ram", ["decoder3.0"])
    t.file(r0 + "/dax_region0/devtype", "cxl_dax_region")
    cxl_link(t, "dax_region0", r0 + "/dax_region0")
    add_dax(t, r0 + "/dax_region0/dax0.0", "dax0.0", 8 * GiB, 1, "device_dax", align=1 * GiB,
            region=dict(id=0, size=8 * GiB, align=1 * GiB, dynamic=True))
    # region1: pmem region -> pmem_region1 -> nvdimm bridge ndbus1 -> nd region2
    # (same physical range) -> namespace2.0 -> dax2.0 (static, devdax).
    r1 = add_region(t, "decoder0.1", "region1", 16 * GiB, 0x6000000000, "pmem", ["decoder4.0"])
    t.file(r1 + "/pmem_region1/devtype", "cxl_pmem_region")
    cxl_link(t, "pmem_region1", r1 + "/pmem_region1")
    nb = CXL_ROOT + "/nvdimm-bridge0"
    t.file(nb + "/devtype", "cxl_nvdimm_bridge")
    cxl_link(t, "nvdimm-bridge0", nb)
    nd2 = nb + "/ndbus1/region2"
    t.file(nd2 + "/devtype", "nd_pmem")
    t.file(nd2 + "/resource", "0x%x" % 0x6000000000)
    t.file(nd2 + "/size", str(16 * GiB))
    t.file(nd2 + "/numa_node", "0")
    t.file(nd2 + "/target_node", "3")
    t.file(nd2 + "/mapping0", "nmem1,0,%d,0" % (16 * GiB))
    t.file(nd2 + "/namespace2.0/mode", "devdax")
    t.file(nd2 + "/namespace2.0/size", str(16 * GiB))
    t.link("/sys/bus/nd/devices/ndbus1", nb + "/ndbus1")
    t.link("/sys/bus/nd/devices/region2", nd2)
    t.link("/sys/bus/nd/devices/namespace2.0", nd2 + "/namespace2.0")
    t.link("/sys/bus/nd/devices/dax2.0", nd2 + "/dax2.0")
    add_dax(t, nd2 + "/dax2.0/dax2.0", "dax2.0", 16 * GiB - 2 * MiB, 3, "device_dax",
            region=dict(id=2, size=16 * GiB - 2 * MiB, dynamic=False))
    # A legacy NFIT (ACPI0012) pmem region onlined as system RAM: node 2 (nvm).
    nd3 = "/sys/devices/platform/ACPI0012:00/ndbus0/region3"
    t.file(nd3 + "/devtype", "nd_pmem")
    t.file(nd3 + "/resource", "0x%x" % 0x8000000000)
    t.file(nd3 + "/size", str(8 * GiB + 2 * MiB))
    t.file(nd3 + "/numa_node", "0")
    t.file(nd3 + "/target_node", "2")
    t.link("/sys/bus/nd/devices/ndbus0", "/sys/devices/platform/ACPI0012:00/ndbus0")
    t.link("/sys/bus/nd/devices/region3", nd3)
    t.link("/sys/bus/nd/devices/dax3.0", nd3 + "/dax3.0")
    add_dax(t, nd3 + "/dax3.0/dax3.0", "dax3.0", 8 * GiB, 2, "kmem",
            region=dict(id=3, size=8 * GiB, dynamic=False))


def grace_hopper(t):
    add_common(t, "6.8.0-1013-nvidia-64k")
    cpus = [(c, 0, c, 0) for c in range(72)]
    add_cpus(t, cpus, arch="arm64")
    nodes = [
        Node(0, list(range(72)), 125829120, 117440512, [10, 80],
             {2048: (0, 0), 524288: (4, 4), 16777216: (0, 0)}, [("Normal", 60)]),
        # The GPU's HBM, onlined by the NVIDIA driver as a CPU-less node.
        Node(1, [], 99614720, 98566144, [80, 10],
             {2048: (0, 0), 524288: (0, 0), 16777216: (0, 0)}, [("Movable", 48)]),
    ]
    add_nodes(t, nodes)
    add_tiers(t, [(4, [0, 1])])
    add_pci(t, "/sys/devices/pci0009:00/0009:00:00.0", "0009:01:00.0", 0x10de, 0x2342,
            0x030200, 0, {"local_cpulist": "0-71"})


def garbled(t):
    add_common(t)
    cpus = [(c, 0, c, 0) for c in range(4)]
    add_cpus(t, cpus)
    nodes = [
        Node(0, [0, 1, 2, 3], 8126464, 7340032, "10 abc",
             {2048: (0, 0)}, [("Normal", 4)],
             {0: dict(init=[0], rb=100000, wb=100000, rl=100, wl=100)}),
        Node(1, [], 4194304, 4194304, "20 10 30", {2048: (0, 0)}, [("Movable", 2)],
             {0: dict(init=[0], rb="fast", wb=50000, rl="", wl=300)}),
    ]
    add_nodes(t, nodes)
    n0, n1 = "/sys/devices/system/node/node0", "/sys/devices/system/node/node1"
    t.file(n0 + "/cpulist", "0-3,zz")  # cpumap (what hwloc reads) stays right
    t.file(n0 + "/hugepages/hugepages-2048kB/nr_hugepages", "NaN")
    t.file(n1 + "/meminfo", b"\x00\xff\xfeMemT\x01otal garbage \x7f\x80\n\x00")
    t.link(n1 + "/access0/initiators/node7", "/sys/devices/system/node/node7")
    t.link(n1 + "/memory40", "/sys/devices/system/memory/memory40")  # dangling
    t.file("/proc/zoneinfo", b"\x89PNG\r\n\x1a\n\x00\x00junk")
    t.file("/sys/devices/virtual/memory_tiering/memory_tier4/nodelist", "garbage")
    t.file("/sys/devices/virtual/memory_tiering/memory_tier22/nodelist", "1")
    # DAX: one dangling link, one device with junk attributes and a strange driver.
    t.link("/sys/bus/dax/devices/dax9.9", "/sys/devices/nowhere/dax9.9")
    d = "/sys/devices/platform/hmem.0/dax0.0"
    t.file(d + "/size", "lots")
    t.file(d + "/target_node", "x")
    t.file(d + "/align", b"\xff\xff")
    t.link(d + "/driver", "/sys/bus/dax/drivers/weird_driver")
    t.link("/sys/bus/dax/devices/dax0.0", d)
    # CXL: junk memdev attributes, a region pointing at a missing decoder, a dangling region.
    add_cxl_root(t, [("decoder0.0", 0x4000000000, 0x400000000, "ram")])
    md = "/sys/devices/pci0000:35/0000:35:01.0/0000:36:00.0/mem0"
    t.file(md + "/serial", "0xZZZ")
    t.file(md + "/ram/size", "")
    t.file(md + "/numa_node", "-7")
    cxl_link(t, "mem0", md)
    r = CXL_ROOT + "/decoder0.0/region0"
    t.file(r + "/size", "0x")
    t.file(r + "/mode", "sideways")
    t.file(r + "/target0", "decoder9.9")
    t.file(r + "/target1", "not a decoder")
    cxl_link(t, "region0", r)
    t.link("/sys/bus/cxl/devices/region1", CXL_ROOT + "/decoder0.0/region1")


def partial(t):
    add_common(t)
    cpus = [(pkg * 2 + core, pkg, core, pkg) for pkg in (0, 1) for core in (0, 1)]
    add_cpus(t, cpus)
    nodes = [
        Node(0, [0, 1], 8126464, 7340032, [10, 21, 30], {}, [("Normal", 4)]),
        Node(1, [2, 3], None, 0, [21, 10, 30], {2048: (0, 0)}, [("Normal", 4)]),
        Node(2, [], 4194304, 4194304, None, {}, [("Movable", 2)]),
    ]
    # No memory blocks at all: the zone must come from /proc/zoneinfo.
    add_nodes(t, nodes, memory_blocks=False)


def arm_nul_padded(t):
    """A two-socket ARM server whose kernel pads its node attributes with a
    NUL: every node's cpulist reads "0-31\\n\\0" (as captured), and the
    node lists and SLIT rows do the same."""
    add_common(t, "6.1.0-arm64-fixture")
    cpus = [(c, c // 32, c % 32, c // 32) for c in range(64)]
    add_cpus(t, cpus, arch="arm64")
    nodes = [
        Node(0, list(range(32)), 266338304, 250609664, [10, 20],
             {2048: (0, 0), 1048576: (0, 0)}, [("DMA", 4), ("Normal", 123)]),
        Node(1, list(range(32, 64)), 267386880, 262144000, [20, 10],
             {2048: (0, 0), 1048576: (0, 0)}, [("Normal", 127)]),
    ]
    add_nodes(t, nodes)
    add_tiers(t, [(4, [0, 1])])
    base = "/sys/devices/system/node"
    for n in nodes:
        d = "%s/node%d" % (base, n.id)
        t.file(d + "/cpulist", (fmt_list(n.cpus) + "\n\0").encode())
        t.file(d + "/distance", (" ".join(str(v) for v in n.distance) + "\n\0").encode())
    for key in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        t.file("%s/%s" % (base, key), b"0-1\n\0")
    t.file("/sys/devices/system/memory/block_size_bytes", b"80000000\n\0")
    # A NIC the GPU scan must skip; its numa_node is padded the same way.
    d = add_pci(t, "/sys/devices/pci0000:00/0000:00:01.0", "0000:01:00.0", 0x15b3, 0x1021,
                0x020000, 0)
    t.file(d + "/numa_node", b"0\n\0")


def gpu_no_nvml(t):
    """Grace Hopper with the NVIDIA driver loaded but no NVML to ask (a
    container without libnvidia-ml, a daemon started before it): the GPU's
    HBM node is known only from the driver's own procfs. The GPU's PCI
    directory lacks its class attribute (a partial capture)."""
    grace_hopper(t)
    os.remove(t.host("/sys/devices/pci0009:00/0009:00:00.0/0009:01:00.0/class"))
    g = "/proc/driver/nvidia/gpus/0009:01:00.0"
    t.file(g + "/information",
           "Model: \t\t NVIDIA GH200 480GB\nIRQ:   \t\t 151\n"
           "GPU UUID: \t GPU-6c0a5a3e-2d5a-4b8e-9f3a-1f2e3d4c5b6a\n"
           "Bus Location: \t 0009:01:00.0\nDevice Minor: \t 0\nGPU Excluded:\t No\n")
    t.file(g + "/numa_status", "Node:      1\nStatus:    online\nAddress:   "
           "400000000000\nSize:      17c0000000\n")
    t.file("/proc/driver/nvidia/version",
           "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05\n")


def unknown_backing(t):
    """A CPU-less node whose memory has nothing behind it that sysfs shows
    (node 1: no CXL region, hmem, nvdimm or GPU), next to a CXL expander
    onlined partly into a kernel zone (node 2: 2 blocks Normal, 6 Movable)."""
    add_common(t)
    cpus = [(c, 0, c, 0) for c in range(8)]
    add_cpus(t, cpus)
    nodes = [
        Node(0, list(range(8)), 33030144, 30408704, [10, 21, 24],
             {2048: (0, 0), 1048576: (0, 0)}, [("DMA32", 2), ("Normal", 14)]),
        Node(1, [], 8388608, 8388608, [21, 10, 28], {2048: (0, 0), 1048576: (0, 0)},
             [("Normal", 4)]),
        Node(2, [], 16777216, 16252928, [24, 28, 10], {2048: (0, 0), 1048576: (0, 0)},
             [("Normal", 2), ("Movable", 6)]),
    ]
    add_nodes(t, nodes)
    add_tiers(t, [(4, [0, 1]), (22, [2])])
    add_cxl_ram_node(t, 0x400000000, 0x7D0, 2)


TREES = {
    "two-socket-cxl": two_socket_cxl,
    "cxl-devdax": cxl_devdax,
    "grace-hopper": grace_hopper,
    "garbled": garbled,
    "partial": partial,
    "arm-nul-padded": arm_nul_padded,
    "gpu-no-nvml": gpu_no_nvml,
    "unknown-backing": unknown_backing,
}


# ---- capture of this machine ------------------------------------------------------

def capture_this_machine(out_root):
    """hwloc-gather-topology's tree, plus what cxlpool reads that it skips:
    memory blocks (state, valid_zones), /proc/zoneinfo, memory tiers, HMAT
    access classes, DAX and CXL bus entries (with their device dirs)."""
    tmp = tempfile.mkdtemp(prefix="cxlpool-capture-")
    try:
        subprocess.run(["hwloc-gather-topology", "--no-cpuid", os.path.join(tmp, "m")],
                       check=True, stdout=subprocess.DEVNULL)
        with tarfile.open(os.path.join(tmp, "m.tar.bz2")) as tar:
            tar.extractall(tmp)
        shutil.rmtree(out_root, ignore_errors=True)
        shutil.copytree(os.path.join(tmp, "m"), out_root, symlinks=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    t = Tree(out_root)

    def copy_file(path):
        try:
            with open(path, "rb") as f:
                t.file(path, f.read())
        except OSError:
            pass

    def copy_tree(path, depth=4):
        """Files and links under `path`, links kept as links."""
        if depth < 0 or not os.path.isdir(path):
            return
        for name in sorted(os.listdir(path)):
            p = os.path.join(path, name)
            if os.path.islink(p):
                if not os.path.lexists(t.host(p)):
                    os.makedirs(os.path.dirname(t.host(p)), exist_ok=True)
                    os.symlink(os.readlink(p), t.host(p))
            elif os.path.isdir(p):
                copy_tree(p, depth - 1)
            elif os.access(p, os.R_OK) and name not in ("uevent",):
                copy_file(p)

    copy_file("/proc/zoneinfo")
    copy_file("/sys/devices/system/memory/block_size_bytes")
    nodes = "/sys/devices/system/node"
    for n in sorted(os.listdir(nodes)):
        if not n.startswith("node") or not n[4:].isdigit():
            continue
        for m in sorted(os.listdir(os.path.join(nodes, n))):
            if m.startswith("memory") and m[6:].isdigit():
                blk = os.path.realpath(os.path.join(nodes, n, m))
                for attr in ("state", "valid_zones", "phys_index"):
                    copy_file(os.path.join(blk, attr))
            if m.startswith("access"):
                copy_tree(os.path.join(nodes, n, m), 2)
    copy_tree("/sys/devices/virtual/memory_tiering", 1)
    for bus in ("dax", "cxl", "nd"):
        devs = "/sys/bus/%s/devices" % bus
        if os.path.isdir(devs):
            for name in sorted(os.listdir(devs)):
                p = os.path.join(devs, name)
                if not os.path.lexists(t.host(p)):
                    os.makedirs(os.path.dirname(t.host(p)), exist_ok=True)
                    os.symlink(os.readlink(p), t.host(p))
                copy_tree(os.path.realpath(p), 3)


def build(name, out_dir):
    root = os.path.join(out_dir, name, "root")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    TREES[name](Tree(root))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="trees to rebuild (default: all synthetic)")
    ap.add_argument("--out", default=FIXTURES, help="fixtures directory")
    ap.add_argument("--capture-this-machine", action="store_true")
    args = ap.parse_args()
    if args.capture_this_machine:
        capture_this_machine(os.path.join(args.out, "this-machine", "root"))
        return 0
    for name in args.names or sorted(TREES):
        if name not in TREES:
            print("unknown tree %r; known: %s" % (name, ", ".join(sorted(TREES))),
                  file=sys.stderr)
            return 2
        build(name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
