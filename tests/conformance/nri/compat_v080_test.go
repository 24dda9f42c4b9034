//go:build nri_v080

// Glue for NRI v0.8.0 adaptations (containerd 1.7.26 to 2.1): every event but Create, Update and
// StopContainer travels through StateChange.
package nri

import (
	"context"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

// How an adaptation of this version delivers the events that once went through StateChange.
const stateEventDelivery = "state-change"

func startContainer(ctx context.Context, r *adaptation.Adaptation, pod *api.PodSandbox, ctr *api.Container) error {
	return r.StartContainer(ctx, &api.StateChangeEvent{Pod: pod, Container: ctr})
}

func removeContainer(ctx context.Context, r *adaptation.Adaptation, pod *api.PodSandbox, ctr *api.Container) error {
	return r.RemoveContainer(ctx, &api.StateChangeEvent{Pod: pod, Container: ctr})
}
