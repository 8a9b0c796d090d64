package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/bench/node/result"
)

// clockTick is USER_HZ, the unit of /proc/stat and /proc/PID/stat.
const clockTick = 100

// cpuNow reads the cumulative CPU counters a run's CPUSplit is the
// difference of; Other is left for minus.
func (b *bench) cpuNow(ctx context.Context) result.CPUSplit {
	var s result.CPUSplit
	busy, _ := cpuTimes()
	s.Machine = float64(busy) / clockTick
	total, pods, err := b.c.CPUUsage()
	if err == nil {
		s.Node = total.Seconds()
		if list, err := b.c.Client().CoreV1().Pods("steelyard").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=steelyard"}); err == nil {
			for _, p := range list.Items {
				s.Steelyard += pods[string(p.UID)].Seconds()
			}
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.LoadGen = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	s.ControlPlane = controlPlaneCPU()
	return s
}

// cpuDelta is the CPU used between two readings; Other is what the
// machine used beyond this benchmark's processes.
func cpuDelta(from, to result.CPUSplit) result.CPUSplit {
	d := result.CPUSplit{
		Machine:      to.Machine - from.Machine,
		Node:         to.Node - from.Node,
		Steelyard:    to.Steelyard - from.Steelyard,
		LoadGen:      to.LoadGen - from.LoadGen,
		ControlPlane: to.ControlPlane - from.ControlPlane,
	}
	d.Other = max(0, d.Machine-d.Node-d.LoadGen-d.ControlPlane)
	return d
}

// controlPlaneCPU is the CPU time (s) of this process's children that
// are control-plane components (test/controlplane starts them).
func controlPlaneCPU() float64 {
	self := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	total := 0.0
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime (fields 14, 15 from 1).
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		comm, rest := s[open+1:close], strings.Fields(s[close+1:])
		if len(rest) < 13 || rest[1] != self {
			continue
		}
		switch comm {
		case "etcd", "kube-apiserver", "kube-controller", "kube-scheduler":
			u, _ := strconv.ParseFloat(rest[11], 64)
			k, _ := strconv.ParseFloat(rest[12], 64)
			total += (u + k) / clockTick
		}
	}
	return total
}
