//go:build !nri_v080

// Glue for NRI v0.12 adaptations: dedicated per-event calls.
package nri

import (
	"context"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

// How an adaptation of this version delivers the events that once went through StateChange.
const stateEventDelivery = "dedicated"

func startContainer(ctx context.Context, r *adaptation.Adaptation, pod *api.PodSandbox, ctr *api.Container) error {
	return r.StartContainer(ctx, &api.StartContainerRequest{Pod: pod, Container: ctr})
}

func removeContainer(ctx context.Context, r *adaptation.Adaptation, pod *api.PodSandbox, ctr *api.Container) error {
	return r.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr})
}
