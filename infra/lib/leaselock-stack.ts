import { Aws, Stack, StackProps } from 'aws-cdk-lib';
import * as ecr from 'aws-cdk-lib/aws-ecr';
import * as ecs from 'aws-cdk-lib/aws-ecs';
import { Construct } from 'constructs';
import { LeaseCoordinator, LeaseCoordinatorProps } from './lease-coordinator';
import { WorkerService } from './worker-service';

const ECR_IMAGE = /^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?\/([^:@]+)[:@](.+)$/;

export interface LeaselockStackProps extends StackProps {
  readonly coordinator?: LeaseCoordinatorProps;
  /** Worker image reference (a private ECR URI or any registry's); no worker fleet without it. */
  readonly workerImage?: string;
}

/** The coordinator, and the worker fleet when a worker image is given. */
export class LeaselockStack extends Stack {
  readonly coordinator: LeaseCoordinator;
  readonly workers?: WorkerService;

  constructor(scope: Construct, id: string, props: LeaselockStackProps = {}) {
    super(scope, id, props);
    this.coordinator = new LeaseCoordinator(this, 'Coordinator', props.coordinator);
    if (props.workerImage) {
      this.workers = new WorkerService(this, 'Workers', {
        coordinator: this.coordinator,
        image: this.containerImage(props.workerImage),
      });
    }
  }

  /** A private ECR image needs pull permissions on the execution role; others are pulled as is. */
  private containerImage(reference: string): ecs.ContainerImage {
    const ecrImage = ECR_IMAGE.exec(reference);
    if (!ecrImage) {
      return ecs.ContainerImage.fromRegistry(reference);
    }
    const [, account, region, repositoryName, tagOrDigest] = ecrImage;
    const repository = ecr.Repository.fromRepositoryAttributes(this, 'WorkerRepository', {
      repositoryName,
      repositoryArn: `arn:${Aws.PARTITION}:ecr:${region}:${account}:repository/${repositoryName}`,
    });
    return ecs.ContainerImage.fromEcrRepository(repository, tagOrDigest);
  }
}
