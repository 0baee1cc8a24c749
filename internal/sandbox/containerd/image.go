package containerd

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
)

// snapshotter unpacks images for image-rooted calls.
const snapshotter = "overlayfs"

// ImportImage imports an OCI or Docker image tarball into the containerd at address, unpacks it for the
// runtime's snapshotter, and returns the names of the images it holds.
func ImportImage(ctx context.Context, address, namespace, tarball string) ([]string, error) {
	client, err := containerd.New(address, containerd.WithDefaultNamespace(namespace))
	if err != nil {
		return nil, fmt.Errorf("connect containerd at %s: %w", address, err)
	}
	defer client.Close()
	ctx = namespaces.WithNamespace(ctx, namespace)
	f, err := os.Open(tarball)
	if err != nil {
		return nil, fmt.Errorf("open image tarball: %w", err)
	}
	defer f.Close()
	imgs, err := client.Import(ctx, f, containerd.WithAllPlatforms(false))
	if err != nil {
		return nil, fmt.Errorf("import image %s: %w", tarball, err)
	}
	var names []string
	for _, i := range imgs {
		img := containerd.NewImage(client, i)
		if err := img.Unpack(ctx, snapshotter); err != nil {
			return nil, fmt.Errorf("unpack image %s: %w", i.Name, err)
		}
		names = append(names, i.Name)
	}
	return names, nil
}
