// SPDX-License-Identifier: Apache-2.0 OR MIT
// Where this process's waited calls spent their time inside qcuda.ko (issue 35), for the
// latency rows of qcuda_bench.cu: the module sums, per open file of /dev/qcuda, the waited calls
// and the nanoseconds each spent preparing the request (decoding, bounce copies, pinning),
// submitting it (building its chain, adding it to the ring), waiting for the device (polling,
// then sleeping until the interrupt) and finishing (copying out, unpinning, writing the
// response), and shows them in /proc/<pid>/fdinfo/<fd> (guest-kmod/session.rs show_fdinfo:
// qcuda-waited-calls, qcuda-prepare-ns, qcuda-submit-ns, qcuda-wait-ns, qcuda-finish-ns; its
// other fields are gauges of the ring and of held pages, not sums over calls). Natively, and over
// the device double (a memfd), no descriptor links to /dev/qcuda and nothing is read.
//
// Plain C++ (no CUDA): tests/host/check-bench-phases compiles it with the host compiler.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <dirent.h>
#include <unistd.h>

// The sums of every descriptor of the device at one moment.
struct ModulePhases {
    int files = 0;     // descriptors that link to the device
    bool read = false; // every one of them reported all five sums
    uint64_t calls = 0, prepare_ns = 0, submit_ns = 0, wait_ns = 0, finish_ns = 0;
};

// Adds one fdinfo text's sums to `into`; false (nothing added) if any of the five is missing.
inline bool add_fdinfo(const std::string &text, ModulePhases &into)
{
    struct Field {
        const char *key;
        uint64_t value;
        bool seen;
    } fields[] = {{"qcuda-waited-calls:", 0, false},
                  {"qcuda-prepare-ns:", 0, false},
                  {"qcuda-submit-ns:", 0, false},
                  {"qcuda-wait-ns:", 0, false},
                  {"qcuda-finish-ns:", 0, false}};
    size_t at = 0;
    while (at < text.size()) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos)
            end = text.size();
        std::string line = text.substr(at, end - at);
        at = end + 1;
        for (Field &f : fields) {
            size_t n = std::strlen(f.key);
            if (line.compare(0, n, f.key) != 0)
                continue;
            const char *v = line.c_str() + n;
            while (*v == ' ' || *v == '\t')
                v++;
            char *rest = nullptr;
            unsigned long long x = std::strtoull(v, &rest, 10);
            if (rest == v || (*rest != '\0' && *rest != ' ' && *rest != '\t'))
                return false;
            f.value = x;
            f.seen = true;
        }
    }
    for (const Field &f : fields)
        if (!f.seen)
            return false;
    into.calls += fields[0].value;
    into.prepare_ns += fields[1].value;
    into.submit_ns += fields[2].value;
    into.wait_ns += fields[3].value;
    into.finish_ns += fields[4].value;
    return true;
}

// The whole file at `path` ("" if it cannot be read).
inline std::string read_text(const std::string &path)
{
    std::string text;
    FILE *f = std::fopen(path.c_str(), "r");
    if (!f)
        return text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
        text.append(buf, n);
    std::fclose(f);
    return text;
}

// The sums of every descriptor of this process that links to `device` (found by scanning
// /proc/self/fd), read from `fdinfo` (a folder of files named by descriptor; another than
// /proc/self/fdinfo only in tests/host/check-bench-phases).
inline ModulePhases read_module_phases(const char *device = "/dev/qcuda",
                                       const char *fdinfo = "/proc/self/fdinfo")
{
    ModulePhases p;
    p.read = true;
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) {
        p.read = false;
        return p;
    }
    const int own = dirfd(dir);
    while (dirent *e = readdir(dir)) {
        char *end = nullptr;
        long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == own)
            continue;
        char target[4096];
        std::string link = std::string("/proc/self/fd/") + e->d_name;
        ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (std::strcmp(target, device) != 0)
            continue;
        p.files++;
        if (!add_fdinfo(read_text(std::string(fdinfo) + "/" + e->d_name), p))
            p.read = false;
    }
    closedir(dir);
    if (p.files == 0)
        p.read = false;
    return p;
}

// What `calls` counted calls cost in qcuda.ko between two readings, for a row's progress line:
// " | qcuda.ko: W waited/call, prepare P submit S wait T finish F us, outside O us/call" (the
// phases in µs per waited call; outside: the row's `row_us` per call less the module's share of
// it, W times the four phases: the process's own work and the system call's entry and exit);
// "" where the process has no descriptor of the device (natively). A reading that lacks the sums
// (an older module) or a descriptor opened or closed in between says so instead.
inline std::string module_phases_per_call(const ModulePhases &before, const ModulePhases &after,
                                          long calls, double row_us)
{
    if (before.files == 0 && after.files == 0)
        return "";
    if (!before.read || !after.read)
        return " | qcuda.ko: no phases in fdinfo (the module does not report them)";
    if (before.files != after.files || after.calls < before.calls || calls <= 0)
        return " | qcuda.ko: the device's descriptors changed during the row";
    const uint64_t waited = after.calls - before.calls;
    char buf[256];
    int n = std::snprintf(buf, sizeof buf, " | qcuda.ko: %.2f waited/call",
                          (double)waited / (double)calls);
    if (waited > 0) {
        auto us = [waited](uint64_t a, uint64_t b) {
            return (double)(b >= a ? b - a : 0) / (double)waited / 1e3;
        };
        const double prepare = us(before.prepare_ns, after.prepare_ns),
                     submit = us(before.submit_ns, after.submit_ns),
                     wait = us(before.wait_ns, after.wait_ns),
                     finish = us(before.finish_ns, after.finish_ns);
        const double in_module = (prepare + submit + wait + finish) * (double)waited / (double)calls;
        n += std::snprintf(buf + n, sizeof buf - n,
                           ", prepare %.1f submit %.1f wait %.1f finish %.1f us", prepare, submit,
                           wait, finish);
        if (row_us >= 0)
            std::snprintf(buf + n, sizeof buf - n, ", outside %.1f us/call", row_us - in_module);
    }
    return buf;
}
