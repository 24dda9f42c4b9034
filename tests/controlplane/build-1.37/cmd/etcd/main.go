// Command etcd is etcd's server, built from the version kube-apiserver's module graph pins, so
// the control plane needs no system package and no second download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
